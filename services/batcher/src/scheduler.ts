import type { CallContext } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

/** What a call gives the scheduler: its deadline, its cancellation and its request id. */
export type SchedulerCall = Pick<CallContext, 'deadlineMs' | 'signal' | 'requestId'>;

/**
 * How the batcher gets requests run on workers (Triton's scheduler interface): the gRPC handler
 * depends on this, and DynamicBatchScheduler is its one implementation. An abstract class so that it
 * is also the Nest token.
 */
export abstract class Scheduler {
  /**
   * Takes a request of a resolved model version; resolves with its response, or rejects with an
   * RpcError: refused at once (bad request, no worker, full queue, infeasible deadline, cancelled
   * call), expired in the queue, or failed on its worker.
   */
  abstract enqueue(request: InferenceRequest, call: SchedulerCall): Promise<InferenceResponse>;

  /** Requests taken and not answered yet: queued, or in a batch on a worker. */
  abstract inflightCount(): number;

  /** Answers every queued request UNAVAILABLE (SHUTTING_DOWN); batches on workers finish. */
  abstract stop(): void;
}
