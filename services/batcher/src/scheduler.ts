import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { type CallContext, RpcError, toRpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { retries, retryBackoffMs } from '@infermesh/mesh';
import { integerParameter } from '@infermesh/tensors';
import { RegistryWatch } from '@infermesh/registry-watch';
import {
  JsonLogger,
  LATENCY_BUCKETS_SECONDS,
  Metrics,
  ModelLabels,
  requestContext,
  spans,
  traceIdsOf,
} from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { Counter, Gauge, Histogram } from 'prom-client';
import { batchItems, batchKey, concatRequests, splitResponse } from './batch-assembly';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import type { BatchingPolicy } from './batching-policy';
import { VersionSettings } from './version-settings';
import { type WorkerHandle, WorkerPool } from './worker-pool';
import { type ReplicaChoice, replicaChoice } from './replica-choice';

/** Statuses that are a worker's own failure, for the edge's outlier detection (bad input, deadlines and cancellations are not). */
const WORKER_FAULTS: ReadonlySet<status> = new Set([status.INTERNAL, status.UNKNOWN, status.DATA_LOSS]);

/** Why a request was answered without reaching a worker. */
/**
 * How much earlier than this batcher a caller may see the same deadline pass: the transits of the
 * call's headers on the hops before it, each hop reading the deadline on arrival. A cancellation
 * this close to the deadline is the deadline's.
 */
export const CALLER_DEADLINE_SKEW_MS = 100;

type Rejection =
  'QUEUE_FULL' | 'DEADLINE_INFEASIBLE' | 'DEADLINE_EXCEEDED' | 'CANCELLED' | 'MODEL_NOT_READY' | 'INVALID_PRIORITY';

/** A request in a version's queue, then in a batch, until it is answered. */
interface Waiting {
  readonly id: number;
  readonly request: InferenceRequest;
  readonly requestId: string;
  /** Items along the batch dimension; 1 for a request that cannot join others. */
  readonly items: number;
  /** Requests with the same key may share a batch; undefined for one that always goes alone. */
  readonly key: string | undefined;
  /** 1 is the highest priority; lowered when the version's levels shrink while it waits. */
  level: number;
  /** performance.now() at arrival. */
  readonly arrivedAt: number;
  /** Epoch milliseconds; undefined when the caller set none. */
  readonly deadlineMs: number | undefined;
  /** The span of the request's call here (tracing on): it learns its batch; the batch span links to it. */
  readonly span: Span | undefined;
  readonly resolve: (response: InferenceResponse) => void;
  readonly reject: (error: RpcError) => void;
  queued: boolean;
  settled: boolean;
  batch: Batch | undefined;
  timer: NodeJS.Timeout | undefined;
  unlink: (() => void) | undefined;
}

/** Requests sent to a worker together. */
interface Batch {
  readonly entries: readonly Waiting[];
  /** Cancels the worker call once no request of the batch wants its answer any more. */
  abort: AbortController;
  /** The worker call has ended: nothing is left to cancel (aborting would only cost an AbortError, its stack and its listeners). */
  ended: boolean;
}

type Outcome = { responses: InferenceResponse[] } | { error: RpcError };

/** The queue of one model version: a FIFO per priority level. */
class VersionQueue {
  /** One FIFO per level (index 0 is level 1); Maps keep insertion order and delete in O(1). */
  readonly levels: Map<number, Waiting>[];
  /** Queued requests and their items, per level. */
  readonly counts: { requests: number; items: number }[];
  length = 0;
  /** A timer that forms the next batch once its oldest request has waited the max queue delay. */
  timer: NodeJS.Timeout | undefined;
  /** Exponentially weighted mean time of a batch on a worker, ms; undefined until one ran. */
  batchMs: number | undefined;
  /** The answers of the last formed batch: with preserve_ordering, the next batch answers after it. */
  delivered: Promise<void> = Promise.resolve();

  constructor(
    readonly name: string,
    readonly model: string,
    readonly version: string,
    public policy: BatchingPolicy,
  ) {
    this.levels = [];
    this.counts = [];
    this.resize(policy.priorityLevels);
  }

  /** Adopts a changed policy; requests keep their level, capped at the new lowest. */
  adopt(policy: BatchingPolicy): void {
    if (policy.priorityLevels !== this.policy.priorityLevels) this.resize(policy.priorityLevels);
    this.policy = policy;
  }

  add(entry: Waiting): void {
    this.levels[entry.level - 1]!.set(entry.id, entry);
    this.counts[entry.level - 1]!.requests += 1;
    this.counts[entry.level - 1]!.items += entry.items;
    this.length += 1;
    entry.queued = true;
  }

  remove(entry: Waiting): void {
    if (!entry.queued) return;
    entry.queued = false;
    this.levels[entry.level - 1]!.delete(entry.id);
    this.counts[entry.level - 1]!.requests -= 1;
    this.counts[entry.level - 1]!.items -= entry.items;
    this.length -= 1;
  }

  /** The next request to serve: the oldest of the highest level that has one. */
  head(): Waiting | undefined {
    for (const level of this.levels) {
      for (const entry of level.values()) return entry;
    }
    return undefined;
  }

  /** The request that has waited longest, whatever its level. */
  oldest(): Waiting | undefined {
    let oldest: Waiting | undefined;
    for (const level of this.levels) {
      for (const entry of level.values()) {
        if (oldest === undefined || entry.arrivedAt < oldest.arrivedAt) oldest = entry;
        break;
      }
    }
    return oldest;
  }

  /** Items queued at the given level or a higher one: the work served before a new request of that level. */
  itemsAhead(level: number): number {
    let items = 0;
    for (let i = 0; i < level; i++) items += this.counts[i]!.items;
    return items;
  }

  *inOrder(): Generator<Waiting> {
    for (const level of this.levels) yield* level.values();
  }

  private resize(levels: number): void {
    const entries = [...this.inOrder()];
    this.levels.length = 0;
    this.counts.length = 0;
    for (let i = 0; i < levels; i++) {
      this.levels.push(new Map());
      this.counts.push({ requests: 0, items: 0 });
    }
    this.length = 0;
    for (const entry of entries) {
      entry.queued = false;
      entry.level = Math.min(entry.level, levels);
      this.add(entry);
    }
  }
}

/**
 * The batcher's dynamic batching. Requests queue per model version, by priority level and then
 * arrival; batches are formed from requests whose inputs agree on every dimension but the first,
 * joined at the byte level, sent to a worker the replica choice picks (least outstanding batches, or
 * the less busy of two at random) among those that have the version (at most
 * BATCHER_MAX_BATCHES_PER_WORKER each), and split back per request.
 *
 * A batch goes at once while a worker is idle, with whatever the queue holds (up to the max batch
 * size); it waits up to the version's max queue delay for more requests while every worker already
 * computes, or while it is below the smallest preferred batch size. A full queue refuses at once; a
 * request whose deadline passes while it waits is answered DEADLINE_EXCEEDED and never reaches a
 * worker, one whose deadline cannot be met given the queue ahead of it and the version's observed
 * batch time is refused at once, and a cancelled call leaves the queue. A batch that fails because
 * its worker is unavailable (or no longer serves the model) is sent once more to another worker, for
 * the requests still waiting. A version goes only to workers whose placement includes its model;
 * when none of them can be reached, its requests, queued or in flight, are answered UNAVAILABLE at
 * once (the router's fallback model then answers for them).
 */
@Injectable()
export class Scheduler implements OnApplicationShutdown {
  private readonly queues = new Map<string, VersionQueue>();
  /** The models that have a queue. */
  private readonly queuedModels = new Set<string>();
  private readonly labels: ModelLabels;
  private nextId = 0;
  /** Makes batch ids unique among batcher replicas (they appear in spans). */
  private readonly instanceTag = randomBytes(4).toString('hex');
  /** Which of the workers with room gets the next batch (BATCHER_REPLICA_CHOICE). */
  private readonly choice: ReplicaChoice;
  private readonly rejections: Counter<'model' | 'reason'>;
  private readonly dispatched: Counter<'model' | 'version' | 'outcome'>;
  private readonly retries: Counter<'model'>;
  private readonly queueTime: Histogram<'model' | 'version'>;
  private readonly batchSize: Histogram<'model' | 'version'>;
  private readonly duration: Histogram<'model' | 'version'>;

  constructor(
    private readonly pool: WorkerPool,
    private readonly settings: VersionSettings,
    @Inject(BATCHER_CONFIG) private readonly config: BatcherConfig,
    private readonly logger: JsonLogger,
    watch: RegistryWatch,
    private readonly metrics: Metrics,
  ) {
    this.choice = replicaChoice(config.replicaChoice);
    // A model version is registered when the registry watch holds it, or when a worker has it (its
    // queue exists only then): only those names become label values, any other is "(unknown)".
    this.labels = new ModelLabels({
      hasModel: (model) => watch.hasModel(model) || this.queuedModels.has(model),
      hasVersion: (model, version) =>
        watch.hasVersion(model, version) || this.queues.has(`models/${model}/versions/${version}`),
    });
    // Queues whose version the registry no longer has share the "(unknown)" labels: depths add up, ages take the oldest.
    const perQueue =
      (value: (queue: VersionQueue) => number, combine: (a: number, b: number) => number) =>
      (gauge: Gauge<'model' | 'version'>) => {
        gauge.reset();
        const values = new Map<string, { labels: { model: string; version: string }; value: number }>();
        for (const queue of this.queues.values()) {
          const labels = this.labels.of(queue.model, queue.version);
          const key = `${labels.model}\u0000${labels.version}`;
          const known = values.get(key);
          values.set(key, { labels, value: known === undefined ? value(queue) : combine(known.value, value(queue)) });
        }
        for (const { labels, value: v } of values.values()) gauge.set(labels, v);
      };
    metrics.gauge(
      'queue_depth',
      'Requests waiting in the queue of each model version.',
      ['model', 'version'],
      perQueue(
        (q) => q.length,
        (a, b) => a + b,
      ),
    );
    metrics.gauge(
      'queue_oldest_age_seconds',
      'How long the oldest request in the queue of each model version has waited: the autoscaling signal.',
      ['model', 'version'],
      perQueue((q) => {
        const oldest = q.oldest();
        return oldest === undefined ? 0 : (performance.now() - oldest.arrivedAt) / 1000;
      }, Math.max),
    );
    this.rejections = metrics.counter(
      'rejections_total',
      'Requests answered without reaching a worker, by model and reason.',
      ['model', 'reason'],
    );
    this.dispatched = metrics.counter(
      'dispatched_total',
      'Requests answered after a worker ran them, by model, version and outcome.',
      ['model', 'version', 'outcome'],
    );
    this.retries = metrics.counter(
      'retries_total',
      'Batches sent again to another worker after their worker was unavailable.',
      ['model'],
    );
    this.queueTime = metrics.histogram(
      'queue_time_seconds',
      'Time from arrival until a request leaves the queue in a batch.',
      ['model', 'version'],
    );
    this.batchSize = metrics.histogram(
      'batch_size',
      'Items per batch sent to workers.',
      ['model', 'version'],
      [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    );
    this.duration = metrics.histogram(
      'dispatch_duration_seconds',
      'Time from arrival to a worker answer.',
      ['model', 'version'],
      LATENCY_BUCKETS_SECONDS,
      { exemplars: true },
    );
    pool.onPolled(() => this.pumpAll());
    // A version's new batching settings apply to the batches formed from now on, also those of the
    // requests already waiting; a version that no longer takes requests keeps its queue until it drains.
    settings.onChange((models) => {
      const changed = new Set(models);
      for (const queue of this.queues.values()) {
        if (!changed.has(queue.model)) continue;
        this.settings.policy(queue.name).then(
          (policy) => {
            if (policy === queue.policy) return;
            queue.adopt(policy);
            if (queue.length > 0) this.pump(queue);
          },
          () => undefined,
        );
      }
    });
  }

  async infer(
    request: InferenceRequest,
    ctx: Pick<CallContext, 'deadlineMs' | 'signal' | 'requestId'>,
  ): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    if (model === '' || version === '')
      throw RpcError.invalidArgument('the batcher needs a model name and a resolved version');
    const name = `models/${model}/versions/${version}`;
    const arrivedAt = performance.now();
    const [policy, workers] = await Promise.all([this.settings.policy(name), this.pool.candidates(name)]);
    if (workers.length === 0) {
      this.rejections.inc({ model: this.labels.model(model), reason: 'MODEL_NOT_READY' });
      throw RpcError.unavailable(`no worker has model "${model}" version ${version} ready`, 'MODEL_NOT_READY');
    }
    const queue = this.queueFor(name, model, version, policy);
    const level = this.levelOf(request, queue);
    if (queue.length >= policy.maxQueueSize) throw this.refuse(queue, 'QUEUE_FULL', this.queueFull(queue));
    const items = policy.maxBatchSize > 0 ? batchItems(request) : undefined;
    const deadlineMs = ctx.deadlineMs;
    const infeasible = this.infeasible(queue, level, items ?? 1, deadlineMs);
    if (infeasible !== undefined) throw this.refuse(queue, 'DEADLINE_INFEASIBLE', infeasible);
    if (ctx.signal.aborted)
      throw this.refuse(queue, 'CANCELLED', new RpcError(status.CANCELLED, 'the call was cancelled'));

    return new Promise<InferenceResponse>((resolve, reject) => {
      const entry: Waiting = {
        id: this.nextId++,
        request,
        requestId: ctx.requestId,
        items: items ?? 1,
        key: items === undefined ? undefined : batchKey(request),
        level,
        arrivedAt,
        deadlineMs,
        span: requestContext.current()?.span,
        resolve,
        reject,
        queued: false,
        settled: false,
        batch: undefined,
        timer: undefined,
        unlink: undefined,
      };
      if (deadlineMs !== undefined) {
        entry.timer = setTimeout(() => this.expire(queue, entry), Math.max(0, deadlineMs - Date.now()));
      }
      const onAbort = () => this.cancel(queue, entry);
      ctx.signal.addEventListener('abort', onAbort, { once: true });
      entry.unlink = () => ctx.signal.removeEventListener('abort', onAbort);
      queue.add(entry);
      this.pump(queue);
    });
  }

  onApplicationShutdown(): void {
    for (const queue of this.queues.values()) {
      clearTimeout(queue.timer);
      for (const entry of [...queue.inOrder()]) {
        queue.remove(entry);
        this.settle(entry, {
          error: new RpcError(status.UNAVAILABLE, 'the batcher is shutting down', { reason: 'SHUTTING_DOWN' }),
        });
      }
    }
  }

  private queueFor(name: string, model: string, version: string, policy: BatchingPolicy): VersionQueue {
    let queue = this.queues.get(name);
    if (queue === undefined) {
      queue = new VersionQueue(name, model, version, policy);
      this.queues.set(name, queue);
      this.queuedModels.add(model);
    } else if (queue.policy !== policy) {
      queue.adopt(policy);
    }
    return queue;
  }

  /** The request's priority level from its `priority` parameter (Triton's: 0 or absent is the default level). */
  private levelOf(request: InferenceRequest, queue: VersionQueue): number {
    const { priorityLevels, defaultPriorityLevel } = queue.policy;
    const parameter = request.parameters['priority'];
    if (parameter === undefined) return defaultPriorityLevel;
    const value = integerParameter(parameter);
    if (value === 0) return defaultPriorityLevel;
    if (Number.isInteger(value) && value >= 1 && value <= priorityLevels) return value;
    this.rejections.inc({ model: this.labels.model(queue.model), reason: 'INVALID_PRIORITY' });
    const what = `model "${queue.model}" version ${queue.version}`;
    throw RpcError.invalidArgument(
      priorityLevels === 1
        ? `parameter "priority" must be 0 or 1: ${what} has one priority level`
        : `parameter "priority" must be an integer from 1 (highest) to ${priorityLevels}, or 0 for the default level ${defaultPriorityLevel}, for ${what}`,
    );
  }

  /** Why a request with this deadline cannot be served in time, or undefined when it may be. */
  private infeasible(
    queue: VersionQueue,
    level: number,
    items: number,
    deadlineMs: number | undefined,
  ): RpcError | undefined {
    if (deadlineMs === undefined || queue.batchMs === undefined) return undefined;
    const estimateMs = this.estimateMs(queue, queue.itemsAhead(level) + items);
    const leftMs = deadlineMs - Date.now();
    if (leftMs >= estimateMs) return undefined;
    return new RpcError(
      status.DEADLINE_EXCEEDED,
      `model "${queue.model}" version ${queue.version} cannot answer within the request's deadline: ${Math.max(0, Math.round(leftMs))} ms are left, and the queue ahead of it and its batch time of about ${queue.batchMs.toFixed(1)} ms need about ${Math.round(estimateMs)} ms`,
      { reason: 'DEADLINE_INFEASIBLE' },
    );
  }

  /** Time to work through this many items of the version: whole batches shared by its workers, plus the batch that holds the last. */
  private estimateMs(queue: VersionQueue, items: number): number {
    const perBatch = Math.max(1, queue.policy.maxBatchSize);
    const workers = Math.max(1, this.pool.available(queue.name).length);
    const batchesBefore = Math.floor(Math.max(0, items - 1) / perBatch);
    return (Math.floor(batchesBefore / workers) + 1) * (queue.batchMs ?? 0);
  }

  private queueFull(queue: VersionQueue): RpcError {
    const retryDelayMs =
      queue.batchMs === undefined
        ? 1_000
        : Math.max(100, this.estimateMs(queue, queue.itemsAhead(queue.policy.priorityLevels)));
    return new RpcError(
      status.RESOURCE_EXHAUSTED,
      `the queue of model "${queue.model}" version ${queue.version} is full (${queue.policy.maxQueueSize} requests); retry later`,
      { reason: 'QUEUE_FULL', retryDelayMs },
    );
  }

  private refuse(queue: VersionQueue, reason: Rejection, error: RpcError): RpcError {
    this.rejections.inc({ model: this.labels.model(queue.model), reason });
    return error;
  }

  private expire(queue: VersionQueue, entry: Waiting): void {
    if (entry.settled) return;
    const waitedMs = Math.round(performance.now() - entry.arrivedAt);
    if (entry.queued) {
      queue.remove(entry);
      this.rejections.inc({ model: this.labels.model(queue.model), reason: 'DEADLINE_EXCEEDED' });
      this.settle(entry, {
        error: new RpcError(
          status.DEADLINE_EXCEEDED,
          `the request's deadline passed after ${waitedMs} ms in the queue of model "${queue.model}" version ${queue.version}; it was not run`,
          { reason: 'DEADLINE_EXCEEDED' },
        ),
      });
      this.pump(queue);
    } else {
      this.settle(entry, {
        error: new RpcError(
          status.DEADLINE_EXCEEDED,
          `the request's deadline passed after ${waitedMs} ms, while its batch ran`,
          { reason: 'DEADLINE_EXCEEDED' },
        ),
      });
    }
  }

  private cancel(queue: VersionQueue, entry: Waiting): void {
    if (entry.settled) return;
    // A caller's deadline reaches this batcher as a cancellation: from the server's own timer at the
    // moment this batcher's would fire, or from an upstream hop whose copy of the deadline passed a
    // little earlier (each hop reads it on arrival, a transit later than its caller did). Either way
    // the request expired.
    if (entry.deadlineMs !== undefined && entry.deadlineMs - Date.now() <= CALLER_DEADLINE_SKEW_MS) {
      this.expire(queue, entry);
      return;
    }
    if (entry.queued) {
      queue.remove(entry);
      this.rejections.inc({ model: this.labels.model(queue.model), reason: 'CANCELLED' });
      this.pump(queue);
    }
    this.settle(entry, { error: new RpcError(status.CANCELLED, 'the call was cancelled') });
  }

  /** Answers a request once; a batch nobody waits for any more is cancelled on its worker. */
  private settle(entry: Waiting, outcome: { response: InferenceResponse } | { error: RpcError }): void {
    if (entry.settled) return;
    entry.settled = true;
    clearTimeout(entry.timer);
    entry.unlink?.();
    if ('response' in outcome) entry.resolve(outcome.response);
    else entry.reject(outcome.error);
    const batch = entry.batch;
    if (batch !== undefined && !batch.ended && batch.entries.every((e) => e.settled)) batch.abort.abort();
  }

  private pumpAll(): void {
    for (const queue of this.queues.values()) if (queue.length > 0) this.pump(queue);
  }

  /** Sends batches from the queue while workers have room, or arms the timer of the batch that waits. */
  private pump(queue: VersionQueue): void {
    clearTimeout(queue.timer);
    queue.timer = undefined;
    while (queue.length > 0) {
      const workers = this.pool.available(queue.name);
      if (workers.length === 0) {
        this.noWorker(queue);
        return;
      }
      const room: WorkerHandle[] = [];
      let idle = false;
      for (const w of workers) {
        if (w.outstanding >= this.config.maxBatchesPerWorker) continue;
        room.push(w);
        if (w.outstanding === 0) idle = true;
      }
      if (room.length === 0) return; // every worker is full: a batch that finishes pumps again
      const worker = this.choice.choose(room);
      const { entries, items, full } = this.form(queue);
      const { preferredBatchSizes, maxQueueDelayMs } = queue.policy;
      const belowPreferred = preferredBatchSizes.length > 0 && items < preferredBatchSizes[0]!;
      if (!full && (!idle || belowPreferred)) {
        const waitMs = maxQueueDelayMs - (performance.now() - entries[0]!.arrivedAt);
        if (waitMs > 0) {
          queue.timer = setTimeout(() => this.pump(queue), Math.ceil(waitMs));
          return;
        }
      }
      this.dispatch(queue, entries, items, worker);
    }
  }

  /**
   * The next batch: the head request and those after it (by level, then arrival) that share its
   * batch key, up to the max batch size, or up to the largest preferred size the queue can fill. It
   * is full when waiting cannot make it better: it has the max batch size or a preferred size, or a
   * queued request of its kind did not fit.
   */
  private form(queue: VersionQueue): { entries: Waiting[]; items: number; full: boolean } {
    const head = queue.head()!;
    const { maxBatchSize, preferredBatchSizes } = queue.policy;
    if (head.key === undefined || head.items >= maxBatchSize) return { entries: [head], items: head.items, full: true };
    let target = maxBatchSize;
    if (preferredBatchSizes.length > 0) {
      let available = 0;
      for (const entry of queue.inOrder()) {
        if (entry.key === head.key && available + entry.items <= maxBatchSize) available += entry.items;
        if (available === maxBatchSize) break;
      }
      target = preferredBatchSizes.filter((size) => size <= available).at(-1) ?? maxBatchSize;
    }
    const entries: Waiting[] = [];
    let items = 0;
    let overflow = false;
    for (const entry of queue.inOrder()) {
      if (entry.key !== head.key) continue;
      if (items + entry.items > target) {
        overflow = true;
        continue;
      }
      entries.push(entry);
      items += entry.items;
      if (items === target) break;
    }
    return { entries, items, full: overflow || items >= maxBatchSize || preferredBatchSizes.includes(items) };
  }

  /** With no worker for the version, asks the workers again; if none has it still, its queue is answered at once. */
  private noWorker(queue: VersionQueue): void {
    void this.pool.refresh().then(() => {
      if (queue.length === 0) return;
      if (this.pool.available(queue.name).length > 0) return this.pump(queue);
      for (const entry of [...queue.inOrder()]) {
        queue.remove(entry);
        this.rejections.inc({ model: this.labels.model(queue.model), reason: 'MODEL_NOT_READY' });
        this.settle(entry, {
          error: RpcError.unavailable(
            `no worker has model "${queue.model}" version ${queue.version} ready`,
            'MODEL_NOT_READY',
          ),
        });
      }
    });
  }

  private dispatch(queue: VersionQueue, entries: Waiting[], items: number, worker: WorkerHandle): void {
    const now = performance.now();
    const labels = this.labels.of(queue.model, queue.version);
    const batchId = `${this.instanceTag}-${entries[0]!.id}`;
    for (const entry of entries) {
      queue.remove(entry);
      this.queueTime.observe(labels, (now - entry.arrivedAt) / 1000);
      entry.span?.setAttributes({
        'infermesh.batch.id': batchId,
        'infermesh.batch.size': items,
        'infermesh.batch.requests': entries.length,
        'infermesh.queue.wait_ms': now - entry.arrivedAt,
      });
    }
    this.batchSize.observe(labels, items);
    const span = batchSpan(queue, entries, batchId, items);
    const outcome = this.execute(queue, entries, worker, span);
    if (span !== undefined)
      void outcome.then((result) => spans.end(span, 'error' in result ? result.error : undefined));
    const deliver = (result: Outcome) => {
      entries.forEach((entry, i) => {
        if (entry.settled) return;
        if ('error' in result) {
          this.dispatched.inc({ ...labels, outcome: 'error' });
          this.settle(entry, result);
        } else {
          this.dispatched.inc({ ...labels, outcome: 'ok' });
          this.metrics.observe(this.duration, labels, (performance.now() - entry.arrivedAt) / 1000, entry.span);
          this.settle(entry, { response: result.responses[i]! });
        }
      });
    };
    if (queue.policy.preserveOrdering) {
      const previous = queue.delivered;
      queue.delivered = Promise.all([previous, outcome]).then(([, result]) => deliver(result));
    } else {
      void outcome.then(deliver);
    }
    void outcome.then(() => this.pumpAll());
  }

  /**
   * Runs a batch on a worker, and again on another one as the edge's retry policy says (in the mesh,
   * the policy's batcher → worker edge; without, once more on UNAVAILABLE). Each answer tells the
   * edge's outlier detection how the worker did.
   */
  private async execute(
    queue: VersionQueue,
    entries: Waiting[],
    first: WorkerHandle,
    span: Span | undefined,
  ): Promise<Outcome> {
    const requests = entries.map((e) => e.request);
    const items = entries.map((e) => e.items);
    const batchRequest = concatRequests(
      requests,
      items,
      entries.length === 1 ? entries[0]!.request.id : `batch-${entries[0]!.id}`,
    );
    let worker = first;
    for (let attempt = 0; ; attempt++) {
      const live = entries.filter((e) => !e.settled);
      if (live.length === 0)
        return { error: new RpcError(status.CANCELLED, 'no request of the batch waits for it any more') };
      const abort = new AbortController();
      const batch: Batch = { entries, abort, ended: false };
      for (const entry of entries) entry.batch = batch;
      // The batch runs under its own context: the latest deadline of its requests (none if one has
      // none), its own cancellation, and the request id of its first request.
      const deadlineMs = live.some((e) => e.deadlineMs === undefined)
        ? undefined
        : Math.max(...live.map((e) => e.deadlineMs!));
      const retry = this.pool.retry;
      const perTry = retry.perTryTimeoutMs === undefined ? undefined : Date.now() + retry.perTryTimeoutMs;
      const attemptDeadlineMs =
        perTry === undefined ? deadlineMs : deadlineMs === undefined ? perTry : Math.min(deadlineMs, perTry);
      const started = performance.now();
      span?.setAttribute('infermesh.worker', worker.address);
      try {
        const response = await requestContext
          .run(
            {
              requestId: entries[0]!.requestId,
              ...(attemptDeadlineMs !== undefined && { deadlineMs: attemptDeadlineMs }),
              signal: abort.signal,
              ...(span !== undefined && { span }),
            },
            () => worker.infer(batchRequest),
          )
          .finally(() => (batch.ended = true));
        const ms = performance.now() - started;
        queue.batchMs = queue.batchMs === undefined ? ms : 0.8 * queue.batchMs + 0.2 * ms;
        this.pool.recordOutcome(worker, 'success');
        return { responses: splitResponse(response, requests, items) };
      } catch (error) {
        const rpcError = toRpcError(error);
        // CANCELLED that this batcher did not ask for: the worker's server ended the call as it went down.
        const dropped = rpcError.code === status.CANCELLED && !abort.signal.aborted;
        const unreachable = dropped || (rpcError.code === status.UNAVAILABLE && rpcError.reason === undefined);
        // The worker does not serve the model (its placement changed since the last poll): another may.
        const notPlaced = rpcError.code === status.FAILED_PRECONDITION && rpcError.reason === 'MODEL_NOT_PLACED';
        if (unreachable) this.pool.markUnreachable(worker);
        if (notPlaced) this.pool.markNotPlaced(worker, queue.model);
        if (unreachable) this.pool.recordOutcome(worker, 'gateway_failure');
        else if (WORKER_FAULTS.has(rpcError.code)) this.pool.recordOutcome(worker, 'failure');
        // A worker that does not hold the model is not a failure: the batch goes to one that does.
        const retriable = notPlaced || retries(retry, unreachable ? status.UNAVAILABLE : rpcError.code);
        const attemptsLeft = attempt + 1 < Math.max(retry.attempts, notPlaced ? 2 : 1);
        const other = retriable && attemptsLeft ? this.otherWorker(queue, worker) : undefined;
        if (other === undefined) {
          if (unreachable) {
            return {
              error: RpcError.unavailable(
                `the worker for model "${queue.model}" version ${queue.version} is unreachable: ${rpcError.message}`,
              ),
            };
          }
          if (notPlaced) {
            this.rejections.inc({ model: this.labels.model(queue.model), reason: 'MODEL_NOT_READY' });
            return {
              error: RpcError.unavailable(
                `no reachable worker serves model "${queue.model}" version ${queue.version}: ${rpcError.message}`,
                'MODEL_NOT_READY',
              ),
            };
          }
          return { error: rpcError };
        }
        this.retries.inc({ model: this.labels.model(queue.model) });
        span?.addEvent('retry', {
          'infermesh.retry.attempt': attempt + 1,
          'infermesh.worker': worker.address,
          'infermesh.retry.to': other.address,
          'exception.message': rpcError.message,
        });
        span?.setAttribute('infermesh.retry.attempts', attempt + 1);
        this.logger.info('batch retried on another worker', {
          model: queue.model,
          version: queue.version,
          from: worker.address,
          to: other.address,
          err: rpcError.message,
        });
        const waitMs = retryBackoffMs(retry, attempt);
        if (waitMs >= 1) await new Promise((resolve) => setTimeout(resolve, waitMs));
        worker = other;
      }
    }
  }

  private otherWorker(queue: VersionQueue, failed: WorkerHandle): WorkerHandle | undefined {
    const others = this.pool.available(queue.name).filter((w) => w !== failed);
    return others.length === 0 ? undefined : this.choice.choose(others);
  }
}

/**
 * The span of a batch (tracing on): a step of the oldest sampled request it carries (so that request's
 * trace runs on to the worker), linked to the span of every request in it, as batching spans are.
 */
function batchSpan(queue: VersionQueue, entries: readonly Waiting[], batchId: string, items: number): Span | undefined {
  if (!spans.enabled) return undefined;
  const traced = entries.filter((e) => e.span !== undefined);
  if (traced.length === 0) return undefined;
  const parent = traced.find((e) => traceIdsOf(e.span)?.sampled === true) ?? traced[0]!;
  return spans.child(
    `batch ${queue.model}`,
    parent.span,
    {
      'infermesh.model': queue.model,
      'infermesh.model.version': queue.version,
      'infermesh.batch.id': batchId,
      'infermesh.batch.size': items,
      'infermesh.batch.requests': entries.length,
    },
    traced.map((e) => ({ context: e.span!.spanContext() })),
  );
}
