import { type Clock, MAX_TIMER_MS, systemClock } from '@infermesh/clock';
import { join } from 'node:path';
import { writeIdentityFiles } from './identity-files';
import { type CertificateAuthority, checkInstanceName, type ServiceIdentity } from './local-ca';

export interface IdentityIssuedEvent {
  identity: ServiceIdentity;
  dir: string;
  spiffeId: string;
  serialNumber: string;
  notAfter: Date;
  /** When it is due to be issued again: half-way through its validity. */
  renewAt: Date;
  /** False for the issue of `ensure`, true for a rotation. */
  rotated: boolean;
}

export interface IdentityIssueFailedEvent {
  identity: ServiceIdentity;
  dir: string;
  error: unknown;
  /** How many rotations of this identity have failed in a row. */
  failures: number;
  /** When the next try is. */
  retryInMs: number;
}

export interface IdentityIssuerOptions {
  ca: CertificateAuthority;
  /** Each instance's files go to `<rootDir>/<instance>/`. */
  rootDir: string;
  /** Lifetime of each certificate. Default 4 hours. */
  lifetimeMs?: number;
  /** Told of each certificate written; what it throws is dropped. */
  onIssued?: (event: IdentityIssuedEvent) => void;
  /** Told of each failed rotation, which is tried again; what it throws is dropped. */
  onError?: (event: IdentityIssueFailedEvent) => void;
  /** Wait before the first retry of a failed rotation, doubled at each failure. Default 1 s. */
  retryInitialMs?: number;
  /** The longest wait between retries. Default 60 s. */
  retryMaxMs?: number;
  clock?: Clock;
}

export const DEFAULT_IDENTITY_LIFETIME_MS = 4 * 3600 * 1000;

interface Tracked {
  identity: ServiceIdentity;
  dir: string;
  cancelTimer: (() => void) | undefined;
  failures: number;
}

/**
 * Keeps instances' identity files fresh: `ensure` issues an identity and writes its files, then
 * issues it again at each half-life, so that a reader rereading the files (grpc-js's
 * FileWatcherCertificateProvider) always holds a valid certificate. A failed rotation is reported to
 * `onError` and tried again with exponential back-off until it succeeds; nothing is thrown from a
 * timer.
 */
export class IdentityIssuer {
  private readonly tracked = new Map<string, Tracked>();
  private readonly pending = new Map<string, { identity: ServiceIdentity; dir: Promise<string> }>();
  private readonly lifetimeMs: number;
  private readonly retryInitialMs: number;
  private readonly retryMaxMs: number;
  private readonly clock: Clock;
  private stopped = false;

  constructor(private readonly options: IdentityIssuerOptions) {
    this.lifetimeMs = options.lifetimeMs ?? DEFAULT_IDENTITY_LIFETIME_MS;
    this.retryInitialMs = options.retryInitialMs ?? 1000;
    this.retryMaxMs = options.retryMaxMs ?? 60_000;
    this.clock = options.clock ?? systemClock;
    if (!(this.retryInitialMs > 0 && this.retryMaxMs >= this.retryInitialMs)) {
      throw new Error(
        `retry back-off must satisfy 0 < retryInitialMs (${this.retryInitialMs}) <= retryMaxMs (${this.retryMaxMs})`,
      );
    }
  }

  /**
   * Issues `identity` a certificate, writes its files to `<rootDir>/<instance>/` and keeps them
   * rotated; returns the folder. An instance already kept is left as it is. The first issue's
   * failure is the caller's: it rejects, and nothing is kept.
   */
  async ensure(identity: ServiceIdentity): Promise<string> {
    if (this.stopped) throw new Error('the identity issuer is stopped');
    checkInstanceName(identity.instance);
    const known = this.tracked.get(identity.instance) ?? this.pending.get(identity.instance);
    if (known !== undefined) {
      if (known.identity.service !== identity.service) {
        throw new Error(
          `instance ${identity.instance} is already the identity of service ${known.identity.service}, not ${identity.service}`,
        );
      }
      return known.dir;
    }
    const entry: Tracked = {
      identity: { ...identity },
      dir: join(this.options.rootDir, identity.instance),
      cancelTimer: undefined,
      failures: 0,
    };
    const dir = this.issue(entry, false).then(() => entry.dir);
    this.pending.set(identity.instance, { identity: entry.identity, dir });
    try {
      return await dir;
    } finally {
      this.pending.delete(identity.instance);
    }
  }

  /** Stops rotating one instance's identity; its files stay. */
  release(instance: string): void {
    const entry = this.tracked.get(instance);
    entry?.cancelTimer?.();
    this.tracked.delete(instance);
  }

  /** Stops every rotation; the files stay. A rotation already under way writes nothing more. */
  stop(): void {
    this.stopped = true;
    for (const entry of this.tracked.values()) entry.cancelTimer?.();
    this.tracked.clear();
  }

  private async issue(entry: Tracked, rotated: boolean): Promise<void> {
    const startMs = this.clock.now();
    const issued = await this.options.ca.issue(entry.identity, this.lifetimeMs);
    if (!this.isCurrent(entry, rotated)) return;
    await writeIdentityFiles(entry.dir, issued, this.options.ca.bundlePem);
    if (!this.isCurrent(entry, rotated)) return;
    entry.failures = 0;
    this.tracked.set(entry.identity.instance, entry);
    const renewAtMs = startMs + Math.floor(Math.max(0, issued.notAfter.getTime() - startMs) / 2);
    this.schedule(entry, renewAtMs);
    notify(this.options.onIssued, {
      identity: { ...entry.identity },
      dir: entry.dir,
      spiffeId: issued.spiffeId,
      serialNumber: issued.serialNumber,
      notAfter: issued.notAfter,
      renewAt: new Date(renewAtMs),
      rotated,
    });
  }

  /** Whether the issue under way still matters: not stopped, and (for a rotation) not released. */
  private isCurrent(entry: Tracked, rotated: boolean): boolean {
    return !this.stopped && (!rotated || this.tracked.get(entry.identity.instance) === entry);
  }

  private async rotate(entry: Tracked): Promise<void> {
    try {
      await this.issue(entry, true);
    } catch (error) {
      if (!this.isCurrent(entry, true)) return;
      entry.failures += 1;
      const retryInMs = Math.min(this.retryMaxMs, this.retryInitialMs * 2 ** (entry.failures - 1));
      this.schedule(entry, this.clock.now() + retryInMs);
      notify(this.options.onError, {
        identity: { ...entry.identity },
        dir: entry.dir,
        error,
        failures: entry.failures,
        retryInMs,
      });
    }
  }

  private schedule(entry: Tracked, atMs: number): void {
    entry.cancelTimer?.();
    const delayMs = Math.max(0, atMs - this.clock.now());
    entry.cancelTimer = this.clock.setTimer(
      () => {
        entry.cancelTimer = undefined;
        if (delayMs > MAX_TIMER_MS) this.schedule(entry, atMs);
        else void this.rotate(entry);
      },
      Math.min(delayMs, MAX_TIMER_MS),
    );
  }
}

function notify<E>(listener: ((event: E) => void) | undefined, event: E): void {
  try {
    listener?.(event);
  } catch {
    // A listener only logs; its failure must not stop the rotation.
  }
}
