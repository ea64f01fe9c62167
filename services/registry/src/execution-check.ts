import { Errors } from '@infermesh/grpc';
import type { Execution } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** The most operator threads a version may ask each of its instances for. */
export const MAX_INTRA_OP_THREADS = 256;

/**
 * Checks how a version asks to be run and returns what to store: undefined when it asks for nothing
 * (every field at its default). Refuses with INVALID_ARGUMENT an intra_op_threads above 256.
 */
export function checkExecution(execution: Execution | undefined): Execution | undefined {
  if (execution === undefined || execution.intraOpThreads === 0) return undefined;
  if (execution.intraOpThreads > MAX_INTRA_OP_THREADS) {
    throw Errors.invalidRequest(
      `execution: intra_op_threads is ${execution.intraOpThreads}; it can be at most ${MAX_INTRA_OP_THREADS} (0: the worker's default)`,
    );
  }
  return execution;
}

/** True when two executions ask for the same thing; unset and all defaults are the same. */
export function sameExecution(a: Execution | undefined, b: Execution | undefined): boolean {
  return (a?.intraOpThreads ?? 0) === (b?.intraOpThreads ?? 0);
}
