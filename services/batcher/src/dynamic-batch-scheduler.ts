import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { Errors, type RpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { requestContext, spans, traceIdsOf } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import { randomBytes } from 'node:crypto';
import { AdmissionControl, noReadyWorker } from './admission-control';
import { type BatchOutcome, BatchExecutor } from './batch-executor';
import { type FormedBatch, formBatch, holdMs } from './batch-formation';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import type { PendingRequest } from './pending-request';
import { REPLICA_CHOICE, type ReplicaChoice } from './replica-choice';
import { Scheduler, type SchedulerCall } from './scheduler';
import { SchedulerMetrics } from './scheduler-metrics';
import { type VersionQueue, VersionQueues } from './version-queues';
import { VersionSettings } from './version-settings';
import { type WorkerHandle, WorkerPool } from './worker-pool';

/**
 * How much earlier than this batcher a caller may see the same deadline pass: the transits of the
 * call's headers on the hops before it, each hop reading the deadline on arrival. A cancellation
 * this close to the deadline is the deadline's.
 */
export const CALLER_DEADLINE_SKEW_MS = 100;

/**
 * The batcher's dynamic batching. Requests queue per model version (VersionQueues), by priority
 * level and then arrival, once admission lets them in (AdmissionControl); batches are formed from
 * requests whose inputs agree on every dimension but the first (formBatch), sent to a worker the
 * replica choice picks among those that have the version and room (fewer than
 * BATCHER_MAX_BATCHES_PER_WORKER batches), run there and retried elsewhere by the BatchExecutor, and
 * answered per request.
 *
 * A batch goes at once while a worker is idle, with whatever the queue holds (up to the max batch
 * size); it waits up to the version's max queue delay for more requests while every worker already
 * computes, or while it is below the smallest preferred batch size (holdMs). A request whose
 * deadline passes while it waits is answered DEADLINE_EXCEEDED and never reaches a worker, and a
 * cancelled call leaves the queue. A version goes only to workers whose placement includes its
 * model; when none of them can be reached, its requests, queued or in flight, are answered
 * UNAVAILABLE at once (the router's fallback model then answers for them).
 */
@Injectable()
export class DynamicBatchScheduler implements Scheduler, OnApplicationShutdown {
  private nextId = 0;
  private inflight = 0;
  /** Makes batch ids unique among batcher replicas (they appear in spans). */
  private readonly instanceTag = randomBytes(4).toString('hex');
  /** The most input bytes one batch carries (maxBatchBytes). */
  private readonly maxBatchBytes: number;

  constructor(
    private readonly pool: WorkerPool,
    private readonly settings: VersionSettings,
    private readonly queues: VersionQueues,
    private readonly admission: AdmissionControl,
    private readonly executor: BatchExecutor,
    private readonly metrics: SchedulerMetrics,
    @Inject(REPLICA_CHOICE) private readonly choice: ReplicaChoice,
    @Inject(BATCHER_CONFIG) private readonly config: BatcherConfig,
    private readonly clock: Clock,
  ) {
    this.maxBatchBytes = maxBatchBytes(config.runtime.maxMessageBytes);
    pool.onPolled(() => this.pumpAll());
    // A version's new batching settings apply to the batches formed from now on, also those of the
    // requests already waiting; a version that no longer takes requests keeps its queue until it drains.
    settings.onChange((models) => {
      const changed = new Set(models);
      for (const queue of this.queues) {
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

  async enqueue(request: InferenceRequest, call: SchedulerCall): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    if (model === '' || version === '')
      throw Errors.invalidRequest('the batcher needs a model name and a resolved version');
    const name = `models/${model}/versions/${version}`;
    const arrivedAtMs = this.clock.monotonic();
    const [policy, workers] = await Promise.all([this.settings.policy(name), this.pool.candidates(name)]);
    if (workers.length === 0) throw this.admission.refuseWithoutWorker(model, version);
    const queue = this.queues.open(name, model, version, policy);
    const { level, items, key } = this.admission.admit(queue, request, call);
    const deadlineMs = call.deadlineMs;

    return new Promise<InferenceResponse>((resolve, reject) => {
      const entry: PendingRequest = {
        id: this.nextId++,
        request,
        requestId: call.requestId,
        items,
        bytes: inputBytes(request),
        key,
        level,
        arrivedAtMs,
        deadlineMs,
        span: requestContext.current()?.span,
        resolve,
        reject,
        queued: false,
        settled: false,
        batch: undefined,
        cancelDeadline: undefined,
        unlink: undefined,
      };
      this.inflight += 1;
      if (deadlineMs !== undefined) {
        entry.cancelDeadline = this.clock.setTimer(() => this.expire(queue, entry), deadlineMs - this.clock.now());
      }
      const onAbort = () => this.cancel(queue, entry);
      call.signal.addEventListener('abort', onAbort, { once: true });
      entry.unlink = () => call.signal.removeEventListener('abort', onAbort);
      queue.add(entry);
      this.pump(queue);
    });
  }

  inflightCount(): number {
    return this.inflight;
  }

  stop(): void {
    for (const queue of this.queues) {
      queue.cancelBatchTimer?.();
      queue.cancelBatchTimer = undefined;
      for (const entry of [...queue.inOrder()]) {
        queue.remove(entry);
        this.settle(entry, { error: Errors.shuttingDown('the batcher is shutting down') });
      }
    }
  }

  onApplicationShutdown(): void {
    this.stop();
  }

  private expire(queue: VersionQueue, entry: PendingRequest): void {
    if (entry.settled) return;
    const waitedMs = Math.round(this.clock.monotonic() - entry.arrivedAtMs);
    if (entry.queued) {
      queue.remove(entry);
      this.metrics.rejected(queue.model, 'DEADLINE_EXCEEDED');
      this.settle(entry, {
        error: Errors.deadlineExceeded(
          `the request's deadline passed after ${waitedMs} ms in the queue of model "${queue.model}" version ${queue.version}; it was not run`,
        ),
      });
      this.pump(queue);
    } else {
      this.settle(entry, {
        error: Errors.deadlineExceeded(`the request's deadline passed after ${waitedMs} ms, while its batch ran`),
      });
    }
  }

  private cancel(queue: VersionQueue, entry: PendingRequest): void {
    if (entry.settled) return;
    // A caller's deadline reaches this batcher as a cancellation: from the server's own timer at the
    // moment this batcher's would fire, or from an upstream hop whose copy of the deadline passed a
    // little earlier (each hop reads it on arrival, a transit later than its caller did). Either way
    // the request expired.
    if (entry.deadlineMs !== undefined && entry.deadlineMs - this.clock.now() <= CALLER_DEADLINE_SKEW_MS) {
      this.expire(queue, entry);
      return;
    }
    if (entry.queued) {
      queue.remove(entry);
      this.metrics.rejected(queue.model, 'CANCELLED');
      this.pump(queue);
    }
    this.settle(entry, { error: Errors.cancelled('the call was cancelled') });
  }

  /** Answers a request once; a batch nobody waits for any more is cancelled on its worker. */
  private settle(entry: PendingRequest, outcome: { response: InferenceResponse } | { error: RpcError }): void {
    if (entry.settled) return;
    entry.settled = true;
    this.inflight -= 1;
    entry.cancelDeadline?.();
    entry.unlink?.();
    if ('response' in outcome) entry.resolve(outcome.response);
    else entry.reject(outcome.error);
    const batch = entry.batch;
    if (batch !== undefined && !batch.ended && batch.entries.every((e) => e.settled)) batch.abort.abort();
  }

  private pumpAll(): void {
    for (const queue of this.queues) if (queue.length > 0) this.pump(queue);
  }

  /** Sends batches from the queue while workers have room, or arms the timer of the batch that waits. */
  private pump(queue: VersionQueue): void {
    queue.cancelBatchTimer?.();
    queue.cancelBatchTimer = undefined;
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
      const batch = formBatch(queue, this.maxBatchBytes);
      const waitMs = holdMs(batch, queue.policy, idle, this.clock.monotonic() - batch.entries[0]!.arrivedAtMs);
      if (waitMs > 0) {
        queue.cancelBatchTimer = this.clock.setTimer(() => this.pump(queue), waitMs);
        return;
      }
      this.dispatch(queue, batch, worker);
    }
  }

  /** With no worker for the version, asks the workers again; if none has it still, its queue is answered at once. */
  private noWorker(queue: VersionQueue): void {
    void this.pool.refresh().then(() => {
      if (queue.length === 0) return;
      if (this.pool.available(queue.name).length > 0) return this.pump(queue);
      for (const entry of [...queue.inOrder()]) {
        queue.remove(entry);
        this.metrics.rejected(queue.model, 'MODEL_NOT_READY');
        this.settle(entry, { error: noReadyWorker(queue.model, queue.version) });
      }
    });
  }

  private dispatch(queue: VersionQueue, { entries, items }: FormedBatch, worker: WorkerHandle): void {
    const nowMs = this.clock.monotonic();
    const labels = this.metrics.labelsOf(queue);
    const batchId = `${this.instanceTag}-${entries[0]!.id}`;
    for (const entry of entries) {
      queue.remove(entry);
      this.metrics.leftQueue(labels, (nowMs - entry.arrivedAtMs) / 1000);
      entry.span?.setAttributes({
        'infermesh.batch.id': batchId,
        'infermesh.batch.size': items,
        'infermesh.batch.requests': entries.length,
        'infermesh.queue.wait_ms': nowMs - entry.arrivedAtMs,
      });
    }
    this.metrics.batchSent(labels, items);
    const span = batchSpan(queue, entries, batchId, items);
    const outcome = this.executor.run(queue, entries, worker, span);
    if (span !== undefined)
      void outcome.then((result) => spans.end(span, 'error' in result ? result.error : undefined));
    const deliver = (result: BatchOutcome) => {
      entries.forEach((entry, i) => {
        if (entry.settled) return;
        if ('error' in result) {
          this.metrics.failed(labels);
          this.settle(entry, result);
        } else {
          this.metrics.answered(labels, (this.clock.monotonic() - entry.arrivedAtMs) / 1000, entry.span);
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
}

/** Bytes of a request's input tensors. */
function inputBytes(request: InferenceRequest): number {
  let bytes = 0;
  for (const input of request.inputs) bytes += input.data.byteLength;
  return bytes;
}

/**
 * The most input bytes a batch carries to a worker: what one message may carry (the batcher's
 * clients of the workers take BATCHER_MAX_MESSAGE_BYTES), less room for what the message holds
 * beside its tensors (names, shapes, parameters). A larger batch fails whole: 5 requests of 16 MiB
 * joined made an 80 MiB message, refused for all five (RESOURCE_EXHAUSTED) before it left.
 */
export function maxBatchBytes(maxMessageBytes: number): number {
  return maxMessageBytes - Math.min(BATCH_MESSAGE_HEADROOM_BYTES, Math.floor(maxMessageBytes / 2));
}
const BATCH_MESSAGE_HEADROOM_BYTES = 64 * 1024;

/**
 * The span of a batch (tracing on): a step of the oldest sampled request it carries (so that request's
 * trace runs on to the worker), linked to the span of every request in it, as batching spans are.
 */
function batchSpan(
  queue: VersionQueue,
  entries: readonly PendingRequest[],
  batchId: string,
  items: number,
): Span | undefined {
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
