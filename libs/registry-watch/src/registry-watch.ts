import { equals } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import type { ServiceClient } from '@infermesh/grpc';
import {
  type Model,
  ModelSchema,
  type RegistryService,
  type WatchModelsResponse,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf, versionIdOf } from '@infermesh/rollout';
import type { JsonLogger, KnownModels, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';

export interface RegistryWatchOptions {
  /** A registry client; the watch uses its WatchModels stream only. */
  client: Pick<ServiceClient<typeof RegistryService>, 'watchModels'>;
  logger: JsonLogger;
  metrics: Metrics;
  /** The registry's address, for log lines and the health details. */
  address: string;
  /** Waits between attempts to reconnect: from initialMs, doubling up to maxMs, each with jitter. */
  backoff?: { initialMs: number; maxMs: number };
  /** In [0, 1); the jitter of the backoff. */
  random?: () => number;
  /** Time: the backoff waits and how long the watch has been disconnected (systemClock unless given). */
  clock?: Clock;
}

/** Where the watch stands, for health details and readiness decisions. */
export interface RegistryWatchStatus {
  /** The stream is open and has delivered its first message. */
  connected: boolean;
  /** At least one snapshot (or a confirmation that the revision is current) arrived: the models are the registry's. */
  synced: boolean;
  /** The registry revision of the models held; 0n before the first message. */
  revision: bigint;
  /** Why the stream last failed; undefined while connected. */
  lastError: string | undefined;
  /** Epoch ms since which the watch has not been connected (since it started, when it never was); undefined while connected. */
  disconnectedSince: number | undefined;
}

/** The models whose settings or versions changed, by model id ("mlp" of "models/mlp"). */
export type ModelChangeListener = (models: readonly string[]) => void;

const DEFAULT_BACKOFF = { initialMs: 100, maxMs: 2_000 };

/**
 * Follows the registry's WatchModels stream and holds every model as the registry last said it is,
 * for the data plane (router, batcher, workers) to read without a call: a change made in the
 * registry applies here as soon as its message arrives. A snapshot replaces the models held (those
 * not in it are dropped); a change replaces the models it names and drops the deleted ones.
 *
 * When the stream fails the models stay as they are (the data plane keeps serving with the last
 * configuration it saw) and the watch reconnects forever, with capped exponential backoff and
 * jitter, resuming from the last revision it applied. It logs once when it loses the registry and
 * once when it has it back.
 */
export class RegistryWatch implements KnownModels {
  private readonly held = new Map<string, Model>();
  private readonly listeners = new Set<ModelChangeListener>();
  private readonly backoff: { initialMs: number; maxMs: number };
  private readonly random: () => number;
  private readonly reconnects: Counter;
  private currentRevision = 0n;
  private connected = false;
  private synced = false;
  private lastError: string | undefined;
  private disconnectedSince: number | undefined;
  private closed = false;
  private started: Promise<void> | undefined;
  private readonly abort = new AbortController();
  private wake: (() => void) | undefined;
  private resolveReady!: () => void;
  private readonly readyPromise = new Promise<void>((resolve) => (this.resolveReady = resolve));

  private readonly clock: Clock;

  constructor(private readonly options: RegistryWatchOptions) {
    this.backoff = options.backoff ?? DEFAULT_BACKOFF;
    this.random = options.random ?? Math.random;
    this.clock = options.clock ?? systemClock;
    this.disconnectedSince = this.clock.now();
    const { metrics } = options;
    metrics.gauge(
      'registry_watch_connected',
      'Whether the registry watch stream is open (1) or not (0): while 0 the last configuration serves.',
      [],
      (gauge) => gauge.set(this.connected ? 1 : 0),
    );
    metrics.gauge('registry_watch_revision', 'The registry revision of the models this service holds.', [], (gauge) =>
      gauge.set(Number(this.currentRevision)),
    );
    metrics.gauge(
      'registry_watch_config_age_seconds',
      'How long the models held may have been out of date: 0 while the watch is connected, else the time since it was.',
      [],
      (gauge) =>
        gauge.set(this.disconnectedSince === undefined ? 0 : (this.clock.now() - this.disconnectedSince) / 1000),
    );
    this.reconnects = metrics.counter(
      'registry_watch_reconnects_total',
      'Times the registry watch stream was opened again after it failed.',
    );
  }

  /** Opens the stream and keeps it open until close(); calling it again does nothing. */
  start(): void {
    this.started ??= this.run().catch((error: unknown) =>
      this.options.logger.error('registry watch stopped', { err: errorMessage(error) }),
    );
  }

  /** Cancels the stream and stops reconnecting; the models stay readable. */
  async close(): Promise<void> {
    this.closed = true;
    this.abort.abort();
    this.wake?.();
    await this.started;
  }

  /** The model as the registry last said it is, by id ("mlp"); undefined when the watch does not hold it. */
  model(id: string): Model | undefined {
    return this.held.get(id);
  }

  /** Whether the watch holds the model: it is registered, as far as this service knows. */
  hasModel(id: string): boolean {
    return this.held.has(id);
  }

  /** Whether the model held has a version with this id. */
  hasVersion(id: string, versionId: string): boolean {
    return this.held.get(id)?.versions.some((v) => versionIdOf(v.name) === versionId) === true;
  }

  /** Every model held. */
  models(): Model[] {
    return [...this.held.values()];
  }

  /** The registry revision of the models held; 0n before the first message. */
  get revision(): bigint {
    return this.currentRevision;
  }

  /** Whether the models held are the registry's (a first snapshot arrived), connected now or not. */
  get isSynced(): boolean {
    return this.synced;
  }

  get isConnected(): boolean {
    return this.connected;
  }

  /** Resolves once the first message has arrived; never rejects (it waits through outages). */
  ready(): Promise<void> {
    return this.readyPromise;
  }

  /** Calls the listener with the ids of the models that changed, after each message that changed any. Returns a function that removes it. */
  onChange(listener: ModelChangeListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  status(): RegistryWatchStatus {
    return {
      connected: this.connected,
      synced: this.synced,
      revision: this.currentRevision,
      lastError: this.lastError,
      disconnectedSince: this.disconnectedSince,
    };
  }

  /** The "registry" section of the health details. */
  healthSection(): Record<string, unknown> {
    const section: Record<string, unknown> = {
      address: this.options.address,
      connected: this.connected,
      revision: Number(this.currentRevision),
      models: this.held.size,
      serving_last_config: !this.connected && this.synced,
    };
    if (this.disconnectedSince !== undefined)
      section['disconnected_for_ms'] = this.clock.now() - this.disconnectedSince;
    if (this.lastError !== undefined) section['last_error'] = this.lastError;
    return section;
  }

  private async run(): Promise<void> {
    let attempt = 0;
    let reported = false;
    while (!this.closed) {
      let failure: unknown;
      try {
        const stream = this.options.client.watchModels(
          { fromRevision: this.currentRevision },
          { signal: this.abort.signal },
        );
        for await (const message of stream) {
          if (!this.connected) {
            attempt = 0;
            reported = false;
            this.onConnected();
          }
          this.apply(message);
        }
        failure = new Error('the registry ended the watch stream');
      } catch (error) {
        failure = error;
      }
      if (this.closed) break;
      if (!reported) {
        this.onDisconnected(failure);
        reported = true;
      } else {
        this.lastError = errorMessage(failure);
        this.options.logger.debug('registry watch: reconnect failed', {
          registry: this.options.address,
          err: this.lastError,
        });
      }
      await this.sleep(this.delayMs(attempt++));
      if (!this.closed) this.reconnects.inc();
    }
    this.connected = false;
  }

  private onConnected(): void {
    const downMs = this.disconnectedSince === undefined ? 0 : this.clock.now() - this.disconnectedSince;
    const first = !this.synced;
    this.connected = true;
    this.lastError = undefined;
    this.disconnectedSince = undefined;
    this.options.logger.info(first ? 'registry watch connected' : 'registry watch reconnected', {
      registry: this.options.address,
      from_revision: this.currentRevision.toString(),
      ...(!first && { down_ms: downMs }),
    });
  }

  private onDisconnected(failure: unknown): void {
    const wasConnected = this.connected;
    this.connected = false;
    this.lastError = errorMessage(failure);
    if (wasConnected) this.disconnectedSince = this.clock.now();
    this.options.logger.warn(
      this.synced
        ? 'registry watch lost; serving the last configuration it saw and reconnecting'
        : 'registry watch cannot reach the registry; retrying',
      { registry: this.options.address, revision: this.currentRevision.toString(), err: this.lastError },
    );
  }

  /** Applies one message of the stream and tells the listeners which models changed. */
  private apply(message: WatchModelsResponse): void {
    const changed = new Set<string>();
    const put = (model: Model) => {
      const id = modelIdOf(model.name);
      const known = this.held.get(id);
      // An unchanged model keeps its object, so that readers may compare by identity.
      if (known !== undefined && equals(ModelSchema, known, model)) return id;
      this.held.set(id, model);
      changed.add(id);
      return id;
    };
    if (message.snapshot) {
      const present = new Set(message.models.map(put));
      for (const id of [...this.held.keys()]) {
        if (!present.has(id)) {
          this.held.delete(id);
          changed.add(id);
        }
      }
    } else {
      for (const model of message.models) put(model);
      for (const name of message.deleted) {
        const id = modelIdOf(name);
        if (this.held.delete(id)) changed.add(id);
      }
    }
    this.currentRevision = message.revision;
    if (!this.synced) {
      this.synced = true;
      this.resolveReady();
    }
    if (changed.size === 0) return;
    const names = [...changed];
    for (const listener of this.listeners) {
      try {
        listener(names);
      } catch (error) {
        this.options.logger.error('a registry watch listener failed', { err: errorMessage(error) });
      }
    }
  }

  /** Capped exponential backoff with "equal jitter": between half and all of initial·2^attempt, at most max. */
  private delayMs(attempt: number): number {
    const cap = Math.min(this.backoff.maxMs, this.backoff.initialMs * 2 ** Math.min(attempt, 30));
    return cap / 2 + (cap / 2) * this.random();
  }

  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const cancel = this.clock.setTimer(done, ms);
      function done() {
        cancel();
        resolve();
      }
      this.wake = done;
    }).finally(() => (this.wake = undefined));
  }
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
