import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join } from 'node:path';

export const SERVICE_NAMES = ['registry', 'cache', 'worker', 'batcher', 'router', 'gateway'] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];

/**
 * Where a service's log lines go: each line arrives with the service's name, and for a worker of a
 * system that runs several, which one (0 the first).
 */
export type LogSink = (service: ServiceName, line: string, instance?: number) => void;

/** The compiled entry point of a service, relative to the repository's dist/ folder. */
export function serviceEntry(distDir: string, service: ServiceName): string {
  return join(distDir, 'services', service, 'src', 'main.js');
}

/** One service running as a child process, which can be stopped, killed and started again. */
export class ServiceProcess {
  private child: ChildProcess | undefined;
  private exited: Promise<number | null> = Promise.resolve(null);
  private exitExpected = false;

  constructor(
    readonly name: ServiceName,
    private readonly entry: string,
    private readonly env: NodeJS.ProcessEnv,
    private readonly sink: LogSink,
    private readonly onUnexpectedExit: (name: ServiceName, code: number | null, signal: NodeJS.Signals | null) => void = () => undefined,
  ) {}

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  start(): void {
    if (this.running) return;
    // The IPC channel closes when this process dies, however it dies: the service then shuts down.
    const child = spawn(process.execPath, [this.entry], { env: this.env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    this.child = child;
    for (const stream of [child.stdout, child.stderr]) {
      if (stream !== null) createInterface({ input: stream }).on('line', (line) => this.sink(this.name, line));
    }
    this.exitExpected = false;
    this.exited = new Promise((resolve) =>
      child.once('exit', (code, signal) => {
        if (!this.exitExpected) this.onUnexpectedExit(this.name, code, signal);
        resolve(code);
      }),
    );
  }

  /** SIGTERM and wait for a graceful exit; SIGKILL after graceMs. */
  async stop(graceMs = 15_000): Promise<void> {
    const child = this.child;
    if (child === undefined || !this.running) return;
    this.exitExpected = true;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** SIGKILL: the process dies without any clean-up, as in a crash. */
  async kill(): Promise<void> {
    const child = this.child;
    if (child === undefined || !this.running) return;
    this.exitExpected = true;
    child.kill('SIGKILL');
    await this.exited;
  }
}
