import { Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { Errors, type RpcError } from '@infermesh/grpc';
import type { InferenceRequest } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { integerParameter } from '@infermesh/tensors';
import { batchItems, batchKey } from './batch-assembly';
import type { SchedulerCall } from './scheduler';
import { type Rejection, SchedulerMetrics } from './scheduler-metrics';
import type { VersionQueue } from './version-queues';
import { WorkerPool } from './worker-pool';

/** What admission learned of a request it lets into its version's queue. */
export interface Admitted {
  /** Its priority level, 1 the highest. */
  readonly level: number;
  /** Items along the batch dimension; 1 for a request that cannot join others. */
  readonly items: number;
  /** Requests with the same key may share a batch; undefined for one that always goes alone. */
  readonly key: string | undefined;
}

/** Time before the queue-full refusal asks a client to retry when the version has not run a batch yet. */
const QUEUE_FULL_RETRY_DELAY_MS = 1_000;
/** The shortest retry delay a queue-full refusal asks for. */
const MIN_QUEUE_FULL_RETRY_DELAY_MS = 100;

/** The refusal of a request for a version that no worker has ready (or can load). */
export function noReadyWorker(model: string, version: string): RpcError {
  return Errors.modelNotReady(`no worker has model "${model}" version ${version} ready`);
}

/**
 * Which requests a version's queue takes, decided at once on arrival so that a refusal costs the
 * client no wait: a priority level the version has (the `priority` parameter), room in the queue
 * (the version's max queue size), a deadline that the queue ahead of the request and the version's
 * observed batch time can meet, and a call that is still wanted. Each refusal is counted in
 * rejections_total under its reason.
 */
@Injectable()
export class AdmissionControl {
  constructor(
    private readonly pool: WorkerPool,
    private readonly metrics: SchedulerMetrics,
    private readonly clock: Clock,
  ) {}

  /** Refuses a request for a version no worker has: UNAVAILABLE (MODEL_NOT_READY), so that the router falls back. */
  refuseWithoutWorker(model: string, version: string): RpcError {
    this.metrics.rejected(model, 'MODEL_NOT_READY');
    return noReadyWorker(model, version);
  }

  /** Lets the request into the queue, or throws the refusal, in this order: priority, room, deadline, cancellation. */
  admit(queue: VersionQueue, request: InferenceRequest, call: SchedulerCall): Admitted {
    const level = this.levelOf(request, queue);
    const { policy } = queue;
    if (queue.length >= policy.maxQueueSize) throw this.refuse(queue, 'QUEUE_FULL', this.queueFull(queue));
    const items = policy.maxBatchSize > 0 ? batchItems(request) : undefined;
    const infeasible = this.infeasible(queue, level, items ?? 1, call.deadlineMs);
    if (infeasible !== undefined) throw this.refuse(queue, 'DEADLINE_INFEASIBLE', infeasible);
    if (call.signal.aborted) throw this.refuse(queue, 'CANCELLED', Errors.cancelled('the call was cancelled'));
    return { level, items: items ?? 1, key: items === undefined ? undefined : batchKey(request) };
  }

  /** Time to work through this many items of the version: whole batches shared by its workers, plus the batch that holds the last. */
  private estimateMs(queue: VersionQueue, items: number): number {
    const perBatch = Math.max(1, queue.policy.maxBatchSize);
    const workers = Math.max(1, this.pool.available(queue.name).length);
    const batchesBefore = Math.floor(Math.max(0, items - 1) / perBatch);
    return (Math.floor(batchesBefore / workers) + 1) * (queue.batchMs ?? 0);
  }

  /** The request's priority level from its `priority` parameter (Triton's: 0 or absent is the default level). */
  private levelOf(request: InferenceRequest, queue: VersionQueue): number {
    const { priorityLevels, defaultPriorityLevel } = queue.policy;
    const parameter = request.parameters['priority'];
    if (parameter === undefined) return defaultPriorityLevel;
    const value = integerParameter(parameter);
    if (value === 0) return defaultPriorityLevel;
    if (Number.isInteger(value) && value >= 1 && value <= priorityLevels) return value;
    const what = `model "${queue.model}" version ${queue.version}`;
    throw this.refuse(
      queue,
      'INVALID_PRIORITY',
      Errors.invalidPriority(
        priorityLevels === 1
          ? `parameter "priority" must be 0 or 1: ${what} has one priority level`
          : `parameter "priority" must be an integer from 1 (highest) to ${priorityLevels}, or 0 for the default level ${defaultPriorityLevel}, for ${what}`,
      ),
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
    const leftMs = deadlineMs - this.clock.now();
    if (leftMs >= estimateMs) return undefined;
    return Errors.deadlineInfeasible(
      `model "${queue.model}" version ${queue.version} cannot answer within the request's deadline: ${Math.max(0, Math.round(leftMs))} ms are left, and the queue ahead of it and its batch time of about ${queue.batchMs.toFixed(1)} ms need about ${Math.round(estimateMs)} ms`,
    );
  }

  private queueFull(queue: VersionQueue): RpcError {
    const retryDelayMs =
      queue.batchMs === undefined
        ? QUEUE_FULL_RETRY_DELAY_MS
        : Math.max(
            MIN_QUEUE_FULL_RETRY_DELAY_MS,
            this.estimateMs(queue, queue.itemsAhead(queue.policy.priorityLevels)),
          );
    return Errors.queueFull(
      `the queue of model "${queue.model}" version ${queue.version} is full (${queue.policy.maxQueueSize} requests); retry later`,
      { retryDelayMs },
    );
  }

  private refuse(queue: VersionQueue, reason: Rejection, error: RpcError): RpcError {
    this.metrics.rejected(queue.model, reason);
    return error;
  }
}
