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
import {
  type LoadOptions,
  ModelLoadError,
  ModelRuntime,
  type ModelSession,
  PREPARATION_MODEL,
  type RunResult,
} from './model-runtime';
import { fromWireTensor, toWireTensor, transferables, type WireTensor } from './ort-tensors';

export interface ThreadsRuntimeOptions {
  /** Execution instances per loaded model, each a session on a thread of its own (Triton's instance_group count). */
  instancesPerModel: number;
  /**
   * The most execution threads to run (at least instancesPerModel); none: no limit. Each instance of
   * each model gets a thread of its own while the limit allows; past it, models share the threads
   * hosting the fewest sessions, and models sharing a thread run one at a time.
   */
  executionThreads?: number;
  /** Threads one session uses inside an operator, unless its load asks for another number (LoadOptions). */
  intraOpThreads: number;
  /**
   * How many nice steps below the main thread the execution threads are scheduled (at most nice 19),
   * and so the operator threads onnxruntime starts from them (Linux threads inherit it). 0 or none:
   * as the main thread.
   */
  computeNice?: number;
  /** Told once when the execution threads could not be given computeNice (no /proc/thread-self: not Linux). */
  onPriorityKept?: (reason: string) => void;
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

/** What an execution thread says about a session once it is ready. */
interface ThreadMetadata {
  name: string;
  isTensor: boolean;
  type: string;
  shape: number[];
}

interface Loaded {
  inputs: ThreadMetadata[];
  outputs: ThreadMetadata[];
  outputNames: string[];
}

type FromThread =
  | { type: 'started'; priorityKept?: string }
  | ({ type: 'loaded'; session: number } & Loaded)
  | { type: 'failed'; session: number; message: string }
  | { type: 'unloaded'; session: number }
  | { type: 'result'; id: number; outputs: WireTensor[]; computeMs: number }
  | { type: 'refused'; id: number; message: string };

interface SessionSpec {
  /** The model's bytes; dropped once the instances have started when the session can reload them. */
  model: Uint8Array | undefined;
  provider: string;
  intraOpThreads: number;
  /** Where the model's external data is read from (LoadOptions.weightsDir). */
  weightsDir: string | undefined;
}

/** How long close() waits for a thread to end itself before leaving it to end with the process. */
const CLOSE_TIMEOUT_MS = 60_000;

/** Session ids, unique in the process (a thread hosts sessions of several models). */
let nextSessionId = 1;

/**
 * onnxruntime-node sessions in worker threads: each loaded model gets `instancesPerModel` sessions
 * created from its bytes, each on a different thread. prepare() starts the first model's threads
 * before any model loads, so that what a thread costs (a V8 isolate and a Node environment, ONNX
 * Runtime's start-up) is the worker's, not charged to a model. Each instance gets a thread hosting no
 * other session, started for it if need be, up to `executionThreads`; past that limit models share
 * the threads hosting the fewest sessions. onnxruntime-node 1.30's session.run() computes on the
 * thread's JavaScript thread, so models sharing a thread run one at a time: a request of one waits
 * for the other's run in progress. A thread started beyond the prepared ones ends when its last
 * session is released, and its memory goes back. A request runs on an idle instance of its model or
 * waits, first in first out, for the next one to come free, so a model never runs more batches at
 * once than it has instances. The service's event loop
 * only converts tensors to and from transferable buffers. A thread that dies fails only the requests
 * it was running; it is replaced, and each model that had an instance on it loads one again.
 */
export class ThreadsModelRuntime extends ModelRuntime {
  /** Providers whose libraries are missing from this machine: not tried again. */
  private readonly unavailable = new Map<string, string>();
  private readonly pool: ExecutionPool;

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
    this.pool = new ExecutionPool(
      options.threadFile ?? EXECUTION_THREAD_FILE,
      options.instancesPerModel,
      Math.max(options.executionThreads ?? Infinity, options.instancesPerModel),
      options,
    );
  }

  /** The execution threads running now. */
  get threadCount(): number {
    return this.pool.size;
  }

  /**
   * Starts the first model's execution threads and pays onnxruntime's start-up costs on each (a
   * session of the preparation model, released), so that its load is charged only what the model
   * itself costs.
   */
  override async prepare(executionProviders: readonly string[]): Promise<void> {
    await this.pool.ensure();
    const session = await this.create(PREPARATION_MODEL, executionProviders, undefined, this.pool.size, {});
    await session.release();
  }

  load(
    model: Uint8Array,
    executionProviders: readonly string[],
    reload?: () => Promise<Uint8Array>,
    options: LoadOptions = {},
  ): Promise<ModelSession> {
    return this.create(model, executionProviders, reload, this.options.instancesPerModel, options);
  }

  /** Ends every execution thread once its runs are done (the sessions on them are released). */
  close(): Promise<void> {
    return this.pool.close();
  }

  private async create(
    model: Uint8Array,
    executionProviders: readonly string[],
    reload: (() => Promise<Uint8Array>) | undefined,
    instances: number,
    { weightsDir, intraOpThreads = this.options.intraOpThreads }: LoadOptions,
  ): Promise<ThreadsModelSession> {
    // Each thread receives its own clone: the caller's bytes when they own their buffer, else a compact
    // copy. Kept to start replacement instances only when there is no `reload` to fetch them again.
    const bytes =
      model.byteOffset === 0 && model.byteLength === model.buffer.byteLength ? model : new Uint8Array(model);
    const failures: string[] = [];
    for (const provider of executionProviders) {
      const missing = this.unavailable.get(provider);
      if (missing !== undefined) {
        failures.push(`${provider}: ${missing}`);
        continue;
      }
      const spec: SessionSpec = { model: bytes, provider, intraOpThreads, weightsDir };
      const id = nextSessionId++;
      let threads: ExecutionThread[];
      try {
        threads = await this.pool.acquire(instances, new Set());
      } catch (error) {
        throw new ModelLoadError(`an execution thread failed to start: ${errorMessage(error)}`);
      }
      const first = threads[0]!;
      let loaded: Loaded;
      try {
        loaded = await first.load(id, spec);
      } catch (error) {
        for (const other of threads.slice(1)) other.unreserve();
        const message = errorMessage(error);
        if (/failed to load (shared )?library|backend not found/i.test(message))
          this.unavailable.set(provider, message);
        failures.push(`${provider}: ${message}`);
        continue;
      }
      let session: ThreadsModelSession;
      try {
        session = new ThreadsModelSession(id, spec, loaded, this.pool, this.options, reload);
      } catch (error) {
        for (const other of threads.slice(1)) other.unreserve();
        await first.unload(id);
        throw error;
      }
      try {
        await session.start(first, threads.slice(1));
      } catch (error) {
        await session.release();
        throw error instanceof ModelLoadError ? error : new ModelLoadError(errorMessage(error));
      }
      return session;
    }
    throw new ModelLoadError(`no execution provider could load the model (${failures.join('; ')})`);
  }
}

/**
 * The execution threads: `prepared` started by ensure(), more by acquire() up to `limit` when a load
 * finds no thread hosting nothing; a thread beyond the prepared ones ends when it hosts nothing again.
 * One that dies is replaced (when the pool is below its prepared number) and every session that had
 * an instance on it is told.
 */
class ExecutionPool {
  private readonly threads: ExecutionThread[] = [];
  private readonly starting = new Set<Promise<ExecutionThread>>();
  private closed = false;
  private priorityReported = false;

  constructor(
    private readonly file: string,
    private readonly prepared: number,
    private readonly limit: number,
    private readonly options: ThreadsRuntimeOptions,
  ) {}

  get size(): number {
    return this.threads.length;
  }

  /** Starts threads up to the prepared number; rejects when one fails to start. */
  async ensure(): Promise<void> {
    while (this.threads.length + this.starting.size < this.prepared) void this.spawn().catch(() => undefined);
    await this.settled();
    if (this.threads.length < this.prepared) await this.spawn();
  }

  /**
   * `count` running threads, none of `exclude`: threads hosting no session, started if need be while
   * the pool is below its limit, then those hosting the fewest.
   */
  async acquire(count: number, exclude: ReadonlySet<ExecutionThread>): Promise<ExecutionThread[]> {
    await this.settled();
    const candidates = () =>
      this.threads.filter((t) => !exclude.has(t)).sort((a, b) => a.sessionCount - b.sessionCount);
    const free = candidates().filter((t) => t.sessionCount === 0).length;
    const room = this.limit - this.threads.length - this.starting.size;
    // Distinct threads are a must (an instance each); a thread of its own, only while the limit allows.
    const missing = Math.max(count - candidates().length, Math.min(count - free, room));
    if (missing > 0) await Promise.all(Array.from({ length: missing }, () => this.spawn()));
    const chosen = candidates().slice(0, count);
    if (chosen.length < count) throw new Error('execution threads died as they started');
    // Counted as busy until the caller loads its session there (or lets go), so that loads choosing
    // threads at the same time spread out.
    for (const thread of chosen) thread.reserved += 1;
    return chosen;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.settled();
    await Promise.all(this.threads.splice(0).map((t) => t.close()));
  }

  /** Waits for the threads being started. */
  private async settled(): Promise<void> {
    while (this.starting.size > 0) await Promise.allSettled([...this.starting]);
  }

  private spawn(): Promise<ExecutionThread> {
    const started = ExecutionThread.start(
      this.file,
      this.options.clock ?? systemClock,
      this.options.computeNice ?? 0,
    ).then((thread) => {
      if (thread.priorityKept !== undefined && !this.priorityReported) {
        this.priorityReported = true;
        this.options.onPriorityKept?.(thread.priorityKept);
      }
      if (this.closed) {
        void thread.close();
        throw new Error('the execution threads are closed');
      }
      this.threads.push(thread);
      thread.onCrash = (reason) => this.crashed(thread, reason);
      thread.onIdle = () => this.idle(thread);
      return thread;
    });
    this.starting.add(started);
    const done = () => this.starting.delete(started);
    started.then(done, done);
    return started;
  }

  /** A thread that hosts nothing any more: it ends when the pool has more than its prepared threads. */
  private idle(thread: ExecutionThread): void {
    if (this.closed || this.threads.length <= this.prepared) return;
    const index = this.threads.indexOf(thread);
    if (index < 0) return;
    this.threads.splice(index, 1);
    void thread.close();
  }

  private crashed(thread: ExecutionThread, reason: string): void {
    const index = this.threads.indexOf(thread);
    if (index >= 0) this.threads.splice(index, 1);
    this.options.onThreadCrash?.(reason);
    if (!this.closed && this.threads.length + this.starting.size < this.prepared) {
      this.spawn().catch((error: unknown) =>
        this.options.onThreadCrash?.(`a replacement execution thread failed to start: ${errorMessage(error)}`),
      );
    }
    for (const session of thread.hosted) session.lost(thread);
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
  /** The run itself, timed on its thread. */
  computeMs: number;
  /** The thread that ran it. */
  instance: number;
}

/** A model's execution instances (its sessions on the pool's threads) and the queue of requests waiting for one. */
export class ThreadsModelSession implements ModelSession {
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  readonly executionProvider: string;
  private readonly outputNames: readonly string[];
  private readonly instances = new Set<ExecutionThread>();
  private readonly idle: ExecutionThread[] = [];
  private readonly queue: Job[] = [];
  /** Instances lost and not yet loaded again; replaced one at a time. */
  private lostCount = 0;
  private replacing = false;
  private released = false;

  constructor(
    /** The session's id on each of its threads. */
    private readonly id: number,
    private readonly spec: SessionSpec,
    loaded: Loaded,
    private readonly pool: ExecutionPool,
    private readonly options: ThreadsRuntimeOptions,
    /** The model's bytes again, for a replacement instance, when the session does not keep them. */
    private readonly reload?: () => Promise<Uint8Array>,
  ) {
    this.executionProvider = spec.provider;
    this.inputs = loaded.inputs.map(toSpec);
    this.outputs = loaded.outputs.map(toSpec);
    this.outputNames = loaded.outputNames;
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

  /** Adopts the first instance and loads the others on `others`. */
  async start(first: ExecutionThread, others: readonly ExecutionThread[]): Promise<void> {
    this.adopt(first);
    const loads = await Promise.allSettled(others.map((thread) => thread.load(this.id, this.spec)));
    loads.forEach((load, i) => {
      if (load.status === 'fulfilled') this.adopt(others[i]!);
    });
    const failed = loads.find((o) => o.status === 'rejected');
    if (failed !== undefined)
      throw new ModelLoadError(`an execution instance failed to start: ${errorMessage(failed.reason)}`);
    // Every thread has its own copy: the service's can go, to be fetched again if a thread dies; the
    // weights' directory goes with it (what `reload` returns holds its weights).
    if (this.reload !== undefined) {
      this.spec.model = undefined;
      this.spec.weightsDir = undefined;
    }
  }

  /** Whether the session still holds the model's bytes (for replacement instances). */
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

  /** Lets the runs in progress finish, then releases the model's sessions; its threads go on serving others. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    for (const job of this.queue.splice(0)) job.reject(unavailable('the model version was unloaded'));
    const instances = [...this.instances];
    this.instances.clear();
    this.idle.length = 0;
    await Promise.all(instances.map((i) => i.unload(this.id, this)));
  }

  /** Told by the pool that `thread`, which hosted an instance, died (its request, if any, has failed). */
  lost(thread: ExecutionThread): void {
    if (!this.instances.delete(thread)) return;
    const index = this.idle.indexOf(thread);
    if (index >= 0) this.idle.splice(index, 1);
    if (this.released) return;
    this.lostCount += 1;
    void this.replace();
  }

  private adopt(thread: ExecutionThread): void {
    if (this.released) {
      void thread.unload(this.id);
      return;
    }
    thread.hosted.add(this);
    this.instances.add(thread);
    this.idle.push(thread);
    this.dispatch();
  }

  private dispatch(): void {
    while (this.idle.length > 0 && this.queue.length > 0) {
      const thread = this.idle.pop()!;
      const job = this.queue.shift()!;
      thread.run(this.id, job.feeds, job.fetches).then(
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
    if (!this.instances.has(thread)) return; // lost or released meanwhile
    this.idle.push(thread);
    this.dispatch();
  }

  /** Loads the lost instances again, one at a time, each on a thread that hosts none of this model's. */
  private async replace(): Promise<void> {
    if (this.replacing) return;
    this.replacing = true;
    try {
      while (this.lostCount > 0 && !this.released) {
        try {
          const bytes = this.spec.model ?? (await this.reload!());
          const [thread] = await this.pool.acquire(1, this.instances);
          await thread!.load(this.id, { ...this.spec, model: bytes });
          this.lostCount -= 1;
          this.adopt(thread!);
        } catch (error) {
          if (this.released) return;
          this.options.onThreadCrash?.(`a replacement execution thread failed to start: ${errorMessage(error)}`);
          if (this.instances.size === 0) {
            // Nothing can run the waiting requests soon: let them go elsewhere.
            for (const job of this.queue.splice(0))
              job.reject(unavailable(`no execution thread is running: ${errorMessage(error)}`));
          }
          await (this.options.clock ?? systemClock).sleep(this.options.restartDelayMs ?? 1_000);
        }
      }
    } finally {
      this.replacing = false;
    }
  }
}

/**
 * One worker thread holding sessions of any number of models; runs one request of each at a time.
 * Referenced (keeping the process alive) only while it hosts a session or has work in progress.
 */
class ExecutionThread {
  /** Called once when the thread dies without being closed, after its requests have failed. */
  onCrash: ((reason: string) => void) | undefined;
  /** Called when the thread hosts no session any more (idleIfEmpty). */
  onIdle: (() => void) | undefined;
  /** The sessions with an instance loaded (or loading) here. */
  readonly hosted = new Set<ThreadsModelSession>();
  private readonly jobs = new Map<
    number,
    { resolve: (result: ThreadResult) => void; reject: (error: unknown) => void }
  >();
  private readonly loads = new Map<number, { resolve: (loaded: Loaded) => void; reject: (error: unknown) => void }>();
  private readonly unloads = new Map<number, () => void>();
  /** Sessions loaded or loading here, by id. */
  private readonly sessionIds = new Set<number>();
  private nextId = 1;
  private closing = false;
  private ended = false;
  private lastError: string | undefined;

  private constructor(
    readonly worker: Worker,
    private readonly clock: Clock,
  ) {}

  /** Threads acquired for a session not yet loading here: load() or unreserve() ends each. */
  reserved = 0;

  /** Sessions loaded, loading or about to load here. */
  get sessionCount(): number {
    return this.sessionIds.size + this.reserved;
  }

  unreserve(): void {
    if (this.reserved > 0) this.reserved -= 1;
    this.idleIfEmpty();
  }

  /** Why the thread could not lower its priority as asked; undefined when it did (or was not asked). */
  priorityKept: string | undefined;

  /** Starts a thread (at `nice`, see ThreadsRuntimeOptions.computeNice) and waits until it has loaded onnxruntime-node. */
  static start(file: string, clock: Clock, nice = 0): Promise<ExecutionThread> {
    const worker = new Worker(file, { workerData: { nice } });
    const thread = new ExecutionThread(worker, clock);
    return new Promise((resolve, reject) => {
      let lastError: unknown;
      const onError = (error: unknown) => (lastError = error);
      const onExit = (code: number) => {
        cleanup();
        reject(
          new Error(
            `the execution thread exited with code ${code} as it started${lastError === undefined ? '' : `: ${errorMessage(lastError)}`}`,
          ),
        );
      };
      const onMessage = (message: FromThread) => {
        if (message.type !== 'started') return;
        thread.priorityKept = message.priorityKept;
        cleanup();
        thread.listen();
        thread.updateRef();
        resolve(thread);
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

  /** Creates a session of the model here; rejects with the session's error. */
  load(id: number, spec: SessionSpec): Promise<Loaded> {
    if (this.reserved > 0) this.reserved -= 1; // the reservation becomes the session: the thread stays busy
    if (this.ended) return Promise.reject(new Error(`execution thread ${this.worker.threadId} has ended`));
    this.sessionIds.add(id);
    this.updateRef();
    return new Promise<Loaded>((resolve, reject) => {
      this.loads.set(id, { resolve, reject });
      this.worker.postMessage({
        type: 'load',
        session: id,
        model: spec.model,
        provider: spec.provider,
        intraOpThreads: spec.intraOpThreads,
        weightsDir: spec.weightsDir,
      });
    }).catch((error: unknown) => {
      this.forget(id);
      throw error;
    });
  }

  /** Releases the session here once its run in progress (if any) is done. */
  unload(id: number, session?: ThreadsModelSession): Promise<void> {
    if (this.ended || !this.sessionIds.has(id)) {
      this.forget(id, session);
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => {
      this.unloads.set(id, resolve);
      this.worker.postMessage({ type: 'unload', session: id });
    }).finally(() => this.forget(id, session));
  }

  run(session: number, feeds: WireTensor[], fetches: readonly string[]): Promise<ThreadResult> {
    if (this.ended) return Promise.reject(unavailable(`execution thread ${this.worker.threadId} has ended`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.jobs.set(id, { resolve, reject });
      this.updateRef();
      try {
        this.worker.postMessage({ type: 'run', id, session, feeds, fetches: [...fetches] }, transferables(feeds));
      } catch (error) {
        this.jobs.delete(id);
        this.updateRef();
        reject(error instanceof Error ? error : new Error(String(error)));
      }
    });
  }

  /**
   * Asks the thread to end: it finishes the runs in progress, releases its sessions and ends itself.
   * The thread is never terminated from outside (see execution-thread.js); one that does not end
   * within CLOSE_TIMEOUT_MS is left to end with the process and no longer keeps it alive.
   */
  async close(): Promise<void> {
    if (!this.closing) {
      this.closing = true;
      if (!this.ended) this.worker.postMessage({ type: 'close' });
    }
    if (this.ended) return;
    this.worker.ref();
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

  private forget(id: number, session?: ThreadsModelSession): void {
    const hosted = this.sessionIds.delete(id);
    if (session !== undefined) this.hosted.delete(session);
    this.updateRef();
    if (hosted) this.idleIfEmpty();
  }

  /** Tells the pool when the thread hosts nothing (loaded, loading or reserved) any more. */
  private idleIfEmpty(): void {
    if (this.sessionCount === 0 && !this.ended) this.onIdle?.();
  }

  /** An idle thread without sessions does not keep the process alive. */
  private updateRef(): void {
    if (this.ended || this.closing) return;
    if (this.sessionIds.size > 0 || this.jobs.size > 0) this.worker.ref();
    else this.worker.unref();
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
        const job = this.jobs.get(message.id);
        if (job === undefined) return;
        this.jobs.delete(message.id);
        this.updateRef();
        if (message.type === 'result')
          job.resolve({
            outputs: message.outputs,
            computeMs: message.computeMs,
            instance: this.worker.threadId,
          });
        else job.reject(Errors.invalidTensor(`the model refused the input: ${message.message}`));
        return;
      }
      case 'loaded':
      case 'failed': {
        const load = this.loads.get(message.session);
        if (load === undefined) return;
        this.loads.delete(message.session);
        if (message.type === 'loaded') load.resolve(message);
        else load.reject(new Error(message.message));
        return;
      }
      case 'unloaded': {
        const resolve = this.unloads.get(message.session);
        this.unloads.delete(message.session);
        resolve?.();
        return;
      }
      case 'started':
        return;
    }
  }

  private exited(code: number): void {
    this.ended = true;
    const reason = `execution thread ${this.worker.threadId} exited with code ${code}${this.lastError === undefined ? '' : `: ${this.lastError}`}`;
    const jobs = [...this.jobs.values()];
    this.jobs.clear();
    for (const job of jobs)
      job.reject(unavailable(`the request's execution thread failed (${reason}); it can be retried`));
    const loads = [...this.loads.values()];
    this.loads.clear();
    for (const load of loads) load.reject(new Error(reason));
    const unloads = [...this.unloads.values()];
    this.unloads.clear();
    for (const resolve of unloads) resolve();
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
