import { Inject, Injectable } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { Clock } from '@infermesh/clock';
import { Errors, type RpcError, toRpcError } from '@infermesh/grpc';
import type { InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { retries, retryBackoffMs } from '@infermesh/mesh';
import { JsonLogger, requestContext } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import { concatRequests, splitResponse } from './batch-assembly';
import type { InFlightBatch, PendingRequest } from './pending-request';
import { REPLICA_CHOICE, type ReplicaChoice } from './replica-choice';
import { SchedulerMetrics } from './scheduler-metrics';
import type { VersionQueue } from './version-queues';
import { type WorkerHandle, WorkerPool } from './worker-pool';

/** Statuses that are a worker's own failure, for the edge's outlier detection (bad input, deadlines and cancellations are not). */
const WORKER_FAULTS: ReadonlySet<status> = new Set([status.INTERNAL, status.UNKNOWN, status.DATA_LOSS]);

/** Weight of the newest batch in a version's mean batch time. */
const BATCH_TIME_WEIGHT = 0.2;

/** How a batch ended: a response per request, in the batch's order, or one error for all of them. */
export type BatchOutcome = { responses: InferenceResponse[] } | { error: RpcError };

/**
 * Runs batches on workers: joins the requests into one, sends it to the worker chosen for it, and
 * splits the answer back. A batch that fails goes again to another worker (picked by the replica
 * choice among the others that hold the version) as the batcher → worker edge's retry policy says:
 * in the mesh, the policy's; without, once more on UNAVAILABLE. A worker that no longer serves the
 * model is not a failure: the batch goes to one that does. Each answer tells the edge's outlier
 * detection how the worker did, and each success updates the version's mean batch time.
 */
@Injectable()
export class BatchExecutor {
  constructor(
    private readonly pool: WorkerPool,
    @Inject(REPLICA_CHOICE) private readonly choice: ReplicaChoice,
    private readonly metrics: SchedulerMetrics,
    private readonly logger: JsonLogger,
    private readonly clock: Clock,
  ) {}

  async run(
    queue: VersionQueue,
    entries: readonly PendingRequest[],
    first: WorkerHandle,
    span: Span | undefined,
  ): Promise<BatchOutcome> {
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
      if (live.length === 0) return { error: Errors.cancelled('no request of the batch waits for it any more') };
      const abort = new AbortController();
      const batch: InFlightBatch = { entries, abort, ended: false };
      for (const entry of entries) entry.batch = batch;
      // The batch runs under its own context: the latest deadline of its requests (none if one has
      // none), its own cancellation, and the request id of its first request.
      const deadlineMs = live.some((e) => e.deadlineMs === undefined)
        ? undefined
        : Math.max(...live.map((e) => e.deadlineMs!));
      const retry = this.pool.retry;
      const perTry = retry.perTryTimeoutMs === undefined ? undefined : this.clock.now() + retry.perTryTimeoutMs;
      const attemptDeadlineMs =
        perTry === undefined ? deadlineMs : deadlineMs === undefined ? perTry : Math.min(deadlineMs, perTry);
      const startedMs = this.clock.monotonic();
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
        const ms = this.clock.monotonic() - startedMs;
        queue.batchMs =
          queue.batchMs === undefined ? ms : (1 - BATCH_TIME_WEIGHT) * queue.batchMs + BATCH_TIME_WEIGHT * ms;
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
        const retriable = notPlaced || retries(retry, unreachable ? status.UNAVAILABLE : rpcError.code);
        const attemptsLeft = attempt + 1 < Math.max(retry.attempts, notPlaced ? 2 : 1);
        const other = retriable && attemptsLeft ? this.otherWorker(queue, worker) : undefined;
        if (other === undefined) return { error: this.finalError(queue, rpcError, unreachable, notPlaced) };
        this.metrics.retried(queue.model);
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
        if (waitMs >= 1) await this.clock.sleep(waitMs);
        worker = other;
      }
    }
  }

  /** What the requests of a batch are answered when no worker is left to try. */
  private finalError(queue: VersionQueue, error: RpcError, unreachable: boolean, notPlaced: boolean): RpcError {
    if (unreachable) {
      return Errors.upstreamUnavailable(
        `the worker for model "${queue.model}" version ${queue.version} is unreachable: ${error.message}`,
      );
    }
    if (notPlaced) {
      this.metrics.rejected(queue.model, 'MODEL_NOT_READY');
      return Errors.modelNotReady(
        `no reachable worker serves model "${queue.model}" version ${queue.version}: ${error.message}`,
      );
    }
    return error;
  }

  private otherWorker(queue: VersionQueue, failed: WorkerHandle): WorkerHandle | undefined {
    const others = this.pool.available(queue.name).filter((w) => w !== failed);
    return others.length === 0 ? undefined : this.choice.choose(others);
  }
}
