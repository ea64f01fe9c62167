import { type Clock, systemClock } from '@infermesh/clock';
import { MESH_SERVICES, type MeshService } from '@infermesh/mesh';
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join } from 'node:path';

/** The six services, in the order they start (the mesh's one list of them). */
export const SERVICE_NAMES = MESH_SERVICES;
export type ServiceName = MeshService;

/**
 * Where a service's log lines go: each line arrives with the service's name, and for a worker of a
 * system that runs several, which one (0 the first).
 */
export type LogSink = (service: ServiceName, line: string, instance?: number) => void;

/** The compiled entry point of a service, relative to the repository's dist/ folder. */
export function serviceEntry(distDir: string, service: ServiceName): string {
  return join(distDir, 'services', service, 'src', 'main.js');
}

/**
 * How a supervisor starts again a service that exits without being asked to, as a kubelet does:
 * after a back-off that doubles with each quick exit in a row, until too many quick exits in a row
 * mean a crash loop, which is left stopped (restarting it would only fail again).
 */
export interface RestartPolicy {
  /** The wait before the first restart; it doubles with each quick exit in a row. */
  initialBackoffMs: number;
  /** The longest wait between two restarts. */
  maxBackoffMs: number;
  /** A run at least this long was healthy: the back-off and the count of quick exits start over. */
  stableAfterMs: number;
  /** This many quick exits in a row are a crash loop: no more restarts. */
  crashLoopLimit: number;
}

/** What `infermesh up` uses: 0.5 s, 1 s, 2 s, 4 s between restarts, a crash loop at the 5th exit within 30 s of starting. */
export const DEFAULT_RESTART_POLICY: RestartPolicy = {
  initialBackoffMs: 500,
  maxBackoffMs: 30_000,
  stableAfterMs: 30_000,
  crashLoopLimit: 5,
};

/** How a process ended when nobody asked it to. */
export interface UnexpectedExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** How long it ran. */
  ranMs: number;
  /** The last line it wrote (its fatal error, usually); empty when it wrote none. */
  lastLine: string;
}

/** What a supervised service went through, for the supervisor's log. */
export type SupervisionEvent =
  | { kind: 'restarting'; exit: UnexpectedExit; delayMs: number; quickExits: number }
  | { kind: 'restarted'; pid: number | undefined; restarts: number }
  | { kind: 'crash-loop'; exit: UnexpectedExit; quickExits: number };

/** A supervision event as one line of a supervisor's log, saying why. */
export function describeSupervisionEvent(name: string, event: SupervisionEvent): string {
  const why = (exit: UnexpectedExit) =>
    `${exit.signal !== null ? `killed by ${exit.signal}` : `exit code ${exit.code}`} after ${(exit.ranMs / 1000).toFixed(1)} s` +
    (exit.lastLine === ''
      ? ''
      : `; its last line: ${exit.lastLine.length > 300 ? `${exit.lastLine.slice(0, 300)}…` : exit.lastLine}`);
  switch (event.kind) {
    case 'restarting':
      return `${name} exited unexpectedly (${why(event.exit)}); restarting in ${(event.delayMs / 1000).toFixed(1)} s (quick exits in a row: ${event.quickExits})`;
    case 'restarted':
      return `${name} restarted (pid ${event.pid ?? '?'}, restart ${event.restarts})`;
    case 'crash-loop':
      return `${name} is crash-looping: ${event.quickExits} exits in a row, each soon after starting (${why(event.exit)}); not restarting it again`;
  }
}

export interface ServiceProcessOptions {
  /** Restart the service when it exits unexpectedly; unset: leave it stopped. */
  restart?: RestartPolicy | undefined;
  /** Told of every restart and of a crash loop. */
  onSupervision?: ((name: ServiceName, event: SupervisionEvent) => void) | undefined;
  /** Time: how long a run lasted, the restart back-off, the stop grace period (systemClock unless given). */
  clock?: Clock | undefined;
}

/** Where a service stands: running, waiting to be restarted, given up on, or stopped. */
export type ServiceState = 'running' | 'backoff' | 'crash-loop' | 'stopped';

/** One service running as a child process, which can be stopped, killed and started again, and is restarted by its policy when it crashes. */
export class ServiceProcess {
  private child: ChildProcess | undefined;
  private exited: Promise<number | null> = Promise.resolve(null);
  private exitExpected = false;
  private startedAt = 0;
  private lastLine = '';
  private quickExits = 0;
  private restarts = 0;
  /** Calls off the restart waiting for its back-off; undefined when none waits. */
  private cancelRestartTimer: (() => void) | undefined;
  private crashLooping = false;
  /** stop() or kill() was called and no start() since: an exit is never followed by a restart. */
  private stopRequested = false;

  constructor(
    readonly name: ServiceName,
    private readonly entry: string,
    private readonly env: NodeJS.ProcessEnv,
    private readonly sink: LogSink,
    private readonly onUnexpectedExit: (
      name: ServiceName,
      code: number | null,
      signal: NodeJS.Signals | null,
    ) => void = () => undefined,
    private readonly options: ServiceProcessOptions = {},
  ) {
    this.clock = options.clock ?? systemClock;
  }

  private readonly clock: Clock;

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  get state(): ServiceState {
    if (this.running) return 'running';
    if (this.cancelRestartTimer !== undefined) return 'backoff';
    return this.crashLooping ? 'crash-loop' : 'stopped';
  }

  /** How many times the policy has started the service again. */
  get restartCount(): number {
    return this.restarts;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Starts the process (at once, also while a restart waits for its back-off); nothing when it runs. */
  start(): void {
    this.cancelRestart();
    this.crashLooping = false;
    this.stopRequested = false;
    this.spawn();
  }

  private spawn(): void {
    if (this.running) return;
    // The IPC channel closes when this process dies, however it dies: the service then shuts down.
    const child = spawn(process.execPath, [this.entry], { env: this.env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    this.child = child;
    this.startedAt = this.clock.monotonic();
    this.lastLine = '';
    for (const stream of [child.stdout, child.stderr]) {
      if (stream !== null) {
        createInterface({ input: stream }).on('line', (line) => {
          if (line.trim() !== '') this.lastLine = line;
          this.sink(this.name, line);
        });
      }
    }
    this.exitExpected = false;
    this.exited = new Promise((resolve) =>
      child.once('exit', (code, signal) => {
        if (!this.exitExpected) {
          this.onUnexpectedExit(this.name, code, signal);
          // The last lines may still be in the pipes: read them before saying why it ended.
          setImmediate(() =>
            this.superviseExit({
              code,
              signal,
              ranMs: this.clock.monotonic() - this.startedAt,
              lastLine: this.lastLine,
            }),
          );
        }
        resolve(code);
      }),
    );
  }

  private superviseExit(exit: UnexpectedExit): void {
    const policy = this.options.restart;
    if (policy === undefined || this.stopRequested || this.running) return;
    this.quickExits = exit.ranMs >= policy.stableAfterMs ? 1 : this.quickExits + 1;
    if (this.quickExits >= policy.crashLoopLimit) {
      this.crashLooping = true;
      this.options.onSupervision?.(this.name, { kind: 'crash-loop', exit, quickExits: this.quickExits });
      return;
    }
    const delayMs = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** (this.quickExits - 1));
    this.options.onSupervision?.(this.name, { kind: 'restarting', exit, delayMs, quickExits: this.quickExits });
    // The supervisor waits for it even when it has nothing else to do.
    this.cancelRestartTimer = this.clock.setTimer(
      () => {
        this.cancelRestartTimer = undefined;
        this.restarts += 1;
        this.spawn();
        this.options.onSupervision?.(this.name, { kind: 'restarted', pid: this.pid, restarts: this.restarts });
      },
      delayMs,
      { keepAlive: true },
    );
  }

  private cancelRestart(): void {
    this.cancelRestartTimer?.();
    this.cancelRestartTimer = undefined;
  }

  /** SIGTERM and wait for a graceful exit; SIGKILL after graceMs. A restart waiting for its back-off is called off. */
  async stop(graceMs = 15_000): Promise<void> {
    this.stopRequested = true;
    this.cancelRestart();
    const child = this.child;
    if (child === undefined || !this.running) return;
    this.exitExpected = true;
    child.kill('SIGTERM');
    const cancelKill = this.clock.setTimer(() => child.kill('SIGKILL'), graceMs);
    await this.exited;
    cancelKill();
  }

  /** SIGKILL: the process dies without any clean-up, as in a crash, but one asked for: it is not restarted. */
  async kill(): Promise<void> {
    this.stopRequested = true;
    this.cancelRestart();
    const child = this.child;
    if (child === undefined || !this.running) return;
    this.exitExpected = true;
    child.kill('SIGKILL');
    await this.exited;
  }
}
