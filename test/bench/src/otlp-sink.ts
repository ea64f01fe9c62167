import { type ChildProcess, fork } from 'node:child_process';
import { setPriority } from 'node:os';
import { OtlpReceiver } from '../../e2e/support/otlp-receiver';

type Request = { type: 'count' } | { type: 'clear' };
type Reply = { type: 'endpoint'; endpoint: string } | { type: 'count'; spans: number } | { type: 'cleared' };

/**
 * A counting OTLP receiver in a process of its own, at the lowest priority: in the benchmark's
 * process it would slow the load generator, and at normal priority it would take the CPU the
 * measured services need (a collector runs elsewhere).
 */
export class OtlpSink {
  private child: ChildProcess | undefined;
  endpoint = '';

  async start(): Promise<void> {
    const child = fork(__filename, ['--serve'], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    this.child = child;
    this.endpoint = await new Promise<string>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`the OTLP sink exited with code ${code} before it listened`)));
      child.once('message', (reply: Reply) => {
        if (reply.type === 'endpoint') resolve(reply.endpoint);
      });
    });
  }

  /** Spans received since the start or the last clear. */
  spanCount(): Promise<number> {
    return this.ask({ type: 'count' }).then((reply) => (reply.type === 'count' ? reply.spans : 0));
  }

  async clear(): Promise<void> {
    await this.ask({ type: 'clear' });
  }

  async stop(): Promise<void> {
    const child = this.child;
    if (child === undefined || child.exitCode !== null) return;
    await new Promise((resolve) => {
      child.once('exit', resolve);
      child.kill();
    });
  }

  private ask(request: Request): Promise<Reply> {
    const child = this.child!;
    return new Promise((resolve) => {
      child.once('message', resolve);
      child.send(request);
    });
  }
}

if (process.argv[2] === '--serve' && process.send !== undefined) {
  // Decoding every export takes CPU the measured services would otherwise have: it yields to them.
  setPriority(19);
  const receiver = new OtlpReceiver({ keep: false });
  void receiver.start().then(() => {
    process.send!({ type: 'endpoint', endpoint: receiver.endpoint } satisfies Reply);
    process.on('message', (request: Request) => {
      if (request.type === 'clear') {
        receiver.clear();
        process.send!({ type: 'cleared' } satisfies Reply);
      } else {
        process.send!({ type: 'count', spans: receiver.spanCount } satisfies Reply);
      }
    });
    process.once('disconnect', () => void receiver.stop().then(() => process.exit(0)));
  });
}
