import { create } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import { type RpcError, Errors } from '@infermesh/grpc';
import {
  type Tensor,
  type TensorSpec,
  TensorSpecSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeFromOrt } from '@infermesh/tensors';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { ModelLoadError, ModelRuntime, type ModelSession, type RunResult } from './model-runtime';
import { fromWireTensor, toWireTensor, transferables, type WireTensor } from './ort-tensors';

export interface ThreadsRuntimeOptions {
  /** Execution threads per loaded model, each with its own session (Triton's instance_group count). */
  instancesPerModel: number;
  /** Threads one session uses inside an operator. */
  intraOpThreads: number;
  /** Told when an execution thread dies unasked; the runtime replaces it. */
  onThreadCrash?: (reason: string) => void;
  /** Wait before starting a replacement again after one failed to start. */
  restartDelayMs?: number;
  /** The thread entry: EXECUTION_THREAD_FILE unless a test wraps it. */
  threadFile?: string;
  /** Time: the wait before a replacement starts again, how long close() waits (systemClock unless given). */
  clock?: Clock;
}

/**
 * The thread entry is plain CommonJS kept in the source tree (tsc does not copy .js files), found by
 * walking up from this module: from services/worker/src under jest, from dist/services/worker/src in
 * the compiled service.
 */
export const EXECUTION_THREAD_FILE = (() => {
  const relative = join('services', 'worker', 'src', 'execution-thread.js');
  let dir = __dirname;
  for (;;) {
    if (existsSync(join(dir, relative))) return join(dir, relative);
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`no ${relative} above ${__dirname}`);
    dir = parent;
  }
})();

/** What an execution thread says about its session once it is ready. */
interface ThreadMetadata {
  name: string;
  isTensor: boolean;
  type: string;
  shape: number[];
}

type FromThread =
  | { type: 'ready'; inputs: ThreadMetadata[]; outputs: ThreadMetadata[]; outputNames: string[] }
  | { type: 'failed'; message: string }
  | { type: 'result'; id: number; outputs: WireTensor[] }
  | { type: 'refused'; id: number; message: string };

interface ThreadSpec {
  file: string;
  /** The model's bytes; dropped once the instances have started when the session can reload them. */
  model: Uint8Array | undefined;
  provider: string;
  intraOpThreads: number;
}

/** How long close() waits for a thread to end itself before leaving it to end with the process. */
const CLOSE_TIMEOUT_MS = 60_000;

/**
 * onnxruntime-node sessions in worker threads: each loaded model gets `instancesPerModel` execution
 * threads, each with its own session created from the model bytes. A request runs on an idle
 * instance or waits, first in first out, for the next one to come free, so a model never runs more
 * batches at once than it has instances. The service's event loop only converts tensors to and from
 * transferable buffers; a thread that dies fails only the request it was running and is replaced.
 * (onnxruntime-node 1.30's session.run() itself no longer holds the JS thread while it computes;
 * older releases did, and nothing here depends on which.)
 */
export class ThreadsModelRuntime extends ModelRuntime {
  /** Providers whose libraries are missing from this machine: not tried again. */
  private readonly unavailable = new Map<string, string>();

  constructor(private readonly options: ThreadsRuntimeOptions) {
    super();
    for (const provider of ['cuda', 'tensorrt']) {
      if (!providerLibraryInstalled(provider)) {
        this.unavailable.set(
          provider,
          `the ${provider} execution provider is not installed on this host (README: GPU hosts)`,
        );
      }
    }
  }

  async load(
    model: Uint8Array,
    executionProviders: readonly string[],
    reload?: () => Promise<Uint8Array>,
  ): Promise<ModelSession> {
    // Each thread receives its own clone: the caller's bytes when they own their buffer, else a compact
    // copy. Kept to start replacement threads only when there is no `reload` to fetch them again.
    const bytes =
      model.byteOffset === 0 && model.byteLength === model.buffer.byteLength ? model : new Uint8Array(model);
    const failures: string[] = [];
    for (const provider of executionProviders) {
      const missing = this.unavailable.get(provider);
      if (missing !== undefined) {
        failures.push(`${provider}: ${missing}`);
        continue;
      }
      const spec: ThreadSpec = {
        file: this.options.threadFile ?? EXECUTION_THREAD_FILE,
        model: bytes,
        provider,
        intraOpThreads: this.options.intraOpThreads,
      };
      let first: { thread: ExecutionThread; ready: Extract<FromThread, { type: 'ready' }> };
      try {
        first = await ExecutionThread.start(spec, this.options.clock ?? systemClock);
      } catch (error) {
        const message = errorMessage(error);
        if (/failed to load (shared )?library|backend not found/i.test(message))
          this.unavailable.set(provider, message);
        failures.push(`${provider}: ${message}`);
        continue;
      }
      let session: ThreadsModelSession;
      try {
        session = new ThreadsModelSession(spec, first.ready, this.options, reload);
      } catch (error) {
        await first.thread.close();
        throw error;
      }
      try {
        await session.start(first.thread, this.options.instancesPerModel);
      } catch (error) {
        await session.release();
        throw error instanceof ModelLoadError ? error : new ModelLoadError(errorMessage(error));
      }
      return session;
    }
    throw new ModelLoadError(`no execution provider could load the model (${failures.join('; ')})`);
  }
}

interface Job {
  feeds: WireTensor[];
  fetches: readonly string[];
  resolve: (result: ThreadResult) => void;
  reject: (error: unknown) => void;
}

interface ThreadResult {
  outputs: WireTensor[];
  /** From handing the inputs to the thread to receiving its outputs. */
  computeMs: number;
  /** The thread that ran it. */
  instance: number;
}

/** A model's execution instances and the queue of requests waiting for one. */
export class ThreadsModelSession implements ModelSession {
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  readonly executionProvider: string;
  private readonly outputNames: readonly string[];
  private readonly instances = new Set<ExecutionThread>();
  private readonly idle: ExecutionThread[] = [];
  private readonly queue: Job[] = [];
  private starting = 0;
  private released = false;
  private readonly clock: Clock;

  constructor(
    private readonly spec: ThreadSpec,
    ready: Extract<FromThread, { type: 'ready' }>,
    private readonly options: ThreadsRuntimeOptions,
    /** The model's bytes again, for a replacement thread, when the session does not keep them. */
    private readonly reload?: () => Promise<Uint8Array>,
  ) {
    this.clock = options.clock ?? systemClock;
    this.executionProvider = spec.provider;
    this.inputs = ready.inputs.map(toSpec);
    this.outputs = ready.outputs.map(toSpec);
    this.outputNames = ready.outputNames;
  }

  get instanceCount(): number {
    return this.instances.size;
  }

  /** Instances running a request, instances in all, and requests waiting for one. */
  get occupancy(): { busy: number; instances: number; queued: number } {
    return { busy: this.instances.size - this.idle.length, instances: this.instances.size, queued: this.queue.length };
  }

  /** The worker threads of the live instances, for diagnostics. */
  get threads(): Worker[] {
    return [...this.instances].map((i) => i.worker);
  }

  /** Adopts the first instance and starts the others. */
  async start(first: ExecutionThread, count: number): Promise<void> {
    this.adopt(first);
    const others = await Promise.allSettled(
      Array.from({ length: count - 1 }, () => ExecutionThread.start(this.spec, this.clock)),
    );
    for (const other of others) if (other.status === 'fulfilled') this.adopt(other.value.thread);
    const failed = others.find((o) => o.status === 'rejected');
    if (failed !== undefined)
      throw new ModelLoadError(`an execution instance failed to start: ${errorMessage(failed.reason)}`);
    // Every thread has its own copy: the service's can go, to be fetched again if a thread dies.
    if (this.reload !== undefined) this.spec.model = undefined;
  }

  /** Whether the session still holds the model's bytes (for replacement threads). */
  get holdsModelBytes(): boolean {
    return this.spec.model !== undefined;
  }

  async run(inputs: readonly Tensor[], outputNames: readonly string[]): Promise<RunResult> {
    for (const name of outputNames) {
      if (!this.outputNames.includes(name)) {
        throw Errors.invalidTensor(
          `the model has no output "${name}"; its outputs are ${this.outputNames.map((n) => `"${n}"`).join(', ')}`,
        );
      }
    }
    const feeds = inputs.map(toWireTensor);
    const fetches = outputNames.length > 0 ? outputNames : this.outputNames;
    if (this.released) throw unavailable('the model version is being unloaded');
    const result = await new Promise<ThreadResult>((resolve, reject) => {
      this.queue.push({ feeds, fetches, resolve, reject });
      this.dispatch();
    });
    return { outputs: result.outputs.map(fromWireTensor), computeMs: result.computeMs, instance: result.instance };
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    for (const job of this.queue.splice(0)) job.reject(unavailable('the model version was unloaded'));
    const instances = [...this.instances];
    this.instances.clear();
    this.idle.length = 0;
    await Promise.all(instances.map((i) => i.close()));
  }

  private adopt(thread: ExecutionThread): void {
    if (this.released) {
      void thread.close();
      return;
    }
    this.instances.add(thread);
    thread.onCrash = (reason) => this.crashed(thread, reason);
    this.idle.push(thread);
    this.dispatch();
  }

  private dispatch(): void {
    while (this.idle.length > 0 && this.queue.length > 0) {
      const thread = this.idle.pop()!;
      const job = this.queue.shift()!;
      thread.run(job.feeds, job.fetches).then(
        (result) => {
          job.resolve(result);
          this.finished(thread);
        },
        (error: unknown) => {
          job.reject(error);
          this.finished(thread);
        },
      );
    }
  }

  private finished(thread: ExecutionThread): void {
    if (!this.instances.has(thread)) return; // crashed or released meanwhile
    this.idle.push(thread);
    this.dispatch();
  }

  private crashed(thread: ExecutionThread, reason: string): void {
    if (!this.instances.delete(thread)) return;
    const index = this.idle.indexOf(thread);
    if (index >= 0) this.idle.splice(index, 1);
    this.options.onThreadCrash?.(reason);
    this.replace();
  }

  private replace(): void {
    if (this.released) return;
    this.starting += 1;
    const spec = this.spec;
    const model = spec.model !== undefined ? Promise.resolve(spec.model) : this.reload!();
    model
      .then((bytes) => ExecutionThread.start({ ...spec, model: bytes }, this.clock))
      .then(
        ({ thread }) => {
          this.starting -= 1;
          this.adopt(thread);
        },
        (error: unknown) => {
          this.starting -= 1;
          if (this.released) return;
          this.options.onThreadCrash?.(`a replacement execution thread failed to start: ${errorMessage(error)}`);
          if (this.instances.size === 0 && this.starting === 0) {
            // Nothing can run the waiting requests soon: let them go elsewhere.
            for (const job of this.queue.splice(0))
              job.reject(unavailable(`no execution thread is running: ${errorMessage(error)}`));
          }
          this.clock.setTimer(() => this.replace(), this.options.restartDelayMs ?? 1_000);
        },
      );
  }
}

/** One worker thread holding one session; runs one request at a time. */
class ExecutionThread {
  /** Called once when the thread dies without being closed, after its request has failed. */
  onCrash: ((reason: string) => void) | undefined;
  private job:
    | { id: number; startedAt: bigint; resolve: (result: ThreadResult) => void; reject: (error: unknown) => void }
    | undefined;
  private nextId = 1;
  private closing = false;
  private ended = false;
  private lastError: string | undefined;

  private constructor(
    readonly worker: Worker,
    private readonly clock: Clock,
  ) {}

  /** Starts a thread and waits until its session is ready; rejects with the session's error. */
  static start(
    spec: ThreadSpec,
    clock: Clock,
  ): Promise<{ thread: ExecutionThread; ready: Extract<FromThread, { type: 'ready' }> }> {
    const worker = new Worker(spec.file, {
      workerData: { model: spec.model, provider: spec.provider, intraOpThreads: spec.intraOpThreads },
    });
    const thread = new ExecutionThread(worker, clock);
    return new Promise((resolve, reject) => {
      let lastError: unknown;
      const onError = (error: unknown) => (lastError = error);
      const onExit = (code: number) => {
        cleanup();
        reject(
          new Error(
            `the execution thread exited with code ${code} before its session was ready${lastError === undefined ? '' : `: ${errorMessage(lastError)}`}`,
          ),
        );
      };
      const onMessage = (message: FromThread) => {
        cleanup();
        if (message.type === 'ready') {
          thread.listen();
          resolve({ thread, ready: message });
        } else {
          // A thread that failed to create its session ends itself; nothing of it is left running.
          reject(
            new Error(
              message.type === 'failed'
                ? message.message
                : `unexpected ${message.type} from a starting execution thread`,
            ),
          );
        }
      };
      const cleanup = () => {
        worker.off('error', onError);
        worker.off('exit', onExit);
        worker.off('message', onMessage);
      };
      worker.on('error', onError);
      worker.on('exit', onExit);
      worker.on('message', onMessage);
    });
  }

  run(feeds: WireTensor[], fetches: readonly string[]): Promise<ThreadResult> {
    if (this.job !== undefined) throw new Error('an execution thread runs one request at a time');
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.job = { id, startedAt: process.hrtime.bigint(), resolve, reject };
      try {
        this.worker.postMessage({ type: 'run', id, feeds, fetches: [...fetches] }, transferables(feeds));
      } catch (error) {
        this.job = undefined;
        reject(error instanceof Error ? error : new Error(String(error)));
      }
    });
  }

  /**
   * Asks the thread to end: it finishes the run in progress, releases its session and ends itself.
   * The thread is never terminated from outside (see execution-thread.js); one that does not end
   * within CLOSE_TIMEOUT_MS is left to end with the process and no longer keeps it alive.
   */
  async close(): Promise<void> {
    if (!this.closing) {
      this.closing = true;
      if (!this.ended) this.worker.postMessage({ type: 'close' });
    }
    if (this.ended) return;
    await new Promise<void>((resolve) => {
      const cancel = this.clock.setTimer(() => {
        this.worker.unref();
        resolve();
      }, CLOSE_TIMEOUT_MS);
      this.worker.once('exit', () => {
        cancel();
        resolve();
      });
    });
  }

  private listen(): void {
    this.worker.on('error', (error) => (this.lastError = errorMessage(error)));
    this.worker.on('messageerror', (error) => (this.lastError = errorMessage(error)));
    this.worker.on('exit', (code) => this.exited(code));
    this.worker.on('message', (message: FromThread) => this.received(message));
  }

  private received(message: FromThread): void {
    switch (message.type) {
      case 'result':
      case 'refused': {
        const job = this.job;
        if (job === undefined || job.id !== message.id) return;
        this.job = undefined;
        if (message.type === 'result')
          job.resolve({
            outputs: message.outputs,
            computeMs: Number(process.hrtime.bigint() - job.startedAt) / 1e6,
            instance: this.worker.threadId,
          });
        else job.reject(Errors.invalidTensor(`the model refused the input: ${message.message}`));
        return;
      }
      case 'ready':
      case 'failed':
        return;
    }
  }

  private exited(code: number): void {
    this.ended = true;
    const reason = `execution thread ${this.worker.threadId} exited with code ${code}${this.lastError === undefined ? '' : `: ${this.lastError}`}`;
    const job = this.job;
    this.job = undefined;
    job?.reject(unavailable(`the request's execution thread failed (${reason}); it can be retried`));
    if (!this.closing) this.onCrash?.(reason);
  }
}

function unavailable(message: string): RpcError {
  return Errors.executionFailed(message);
}

function toSpec(meta: ThreadMetadata): TensorSpec {
  if (!meta.isTensor)
    throw new ModelLoadError(`"${meta.name}" is not a tensor; the worker serves tensor inputs and outputs only`);
  const datatype = datatypeFromOrt(meta.type);
  if (datatype === undefined)
    throw new ModelLoadError(`"${meta.name}" has type ${meta.type}, which has no KServe datatype`);
  return create(TensorSpecSchema, {
    name: meta.name,
    datatype,
    shape: meta.shape.map((d) => (d >= 0 ? BigInt(d) : -1n)),
  });
}

function errorMessage(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0]!.trim();
}

/**
 * onnxruntime-node's GPU providers are shared libraries its install script adds next to the native
 * binding; without them a session would only fail after logging a library-load error.
 */
function providerLibraryInstalled(provider: string): boolean {
  if (process.platform !== 'linux') return true; // elsewhere, let onnxruntime try
  const binRoot = join(dirname(require.resolve('onnxruntime-node')), '..', 'bin');
  const library = `libonnxruntime_providers_${provider}.so`;
  try {
    for (const napi of readdirSync(binRoot)) {
      if (existsSync(join(binRoot, napi, process.platform, process.arch, library))) return true;
    }
  } catch {
    return false;
  }
  return false;
}
