import type { RpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { Span } from '@opentelemetry/api';

/** A request the scheduler accepted: in its version's queue, then in a batch, until it is answered. */
export interface PendingRequest {
  readonly id: number;
  readonly request: InferenceRequest;
  readonly requestId: string;
  /** Items along the batch dimension; 1 for a request that cannot join others. */
  readonly items: number;
  /** Bytes of its input tensors: a batch's request to a worker carries the sum of its requests'. */
  readonly bytes: number;
  /** Requests with the same key may share a batch; undefined for one that always goes alone. */
  readonly key: string | undefined;
  /** 1 is the highest priority; lowered when the version's levels shrink while it waits. */
  level: number;
  /** The clock's monotonic time at arrival, ms. */
  readonly arrivedAtMs: number;
  /** Epoch milliseconds; undefined when the caller set none. */
  readonly deadlineMs: number | undefined;
  /** The span of the request's call here (tracing on): it learns its batch; the batch span links to it. */
  readonly span: Span | undefined;
  readonly resolve: (response: InferenceResponse) => void;
  readonly reject: (error: RpcError) => void;
  queued: boolean;
  settled: boolean;
  batch: InFlightBatch | undefined;
  /** Cancels the timer that expires the request at its deadline. */
  cancelDeadline: (() => void) | undefined;
  /** Stops listening to the call's cancellation. */
  unlink: (() => void) | undefined;
}

/** Requests sent to a worker together. */
export interface InFlightBatch {
  readonly entries: readonly PendingRequest[];
  /** Cancels the worker call once no request of the batch wants its answer any more. */
  abort: AbortController;
  /** The worker call has ended: nothing is left to cancel (aborting would only cost an AbortError, its stack and its listeners). */
  ended: boolean;
}
