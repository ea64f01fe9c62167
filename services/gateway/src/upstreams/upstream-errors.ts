import { status } from '@grpc/grpc-js';
import { Errors, type RpcError, toRpcError } from '@infermesh/grpc';
import type { JsonLogger } from '@infermesh/telemetry';

/**
 * An upstream failure as the gateway reports it. Errors our services raised (they carry ErrorInfo)
 * pass through unchanged; errors grpc-js raised itself (no reason: the upstream could not be reached,
 * or the deadline ran out on the way) are logged with their detail and answered with a short message
 * that does not reveal internal addresses.
 */
export function upstreamError(upstream: string, error: unknown, logger: JsonLogger): RpcError {
  const rpcError = toRpcError(error);
  if (rpcError.reason !== undefined) return rpcError;
  switch (rpcError.code) {
    case status.UNAVAILABLE:
      logger.warn(`${upstream} unavailable`, { err: rpcError.message });
      return Errors.upstreamUnavailable(`the ${upstream} is unavailable; retry later`);
    case status.DEADLINE_EXCEEDED:
      return Errors.deadlineExceeded(`the request deadline passed while waiting for the ${upstream}`);
    case status.CANCELLED:
      return Errors.cancelled('the request was cancelled');
    case status.INTERNAL:
    case status.UNKNOWN:
      logger.error(`${upstream} call failed`, { code: status[rpcError.code], err: rpcError.message });
      return Errors.internal(`the ${upstream} failed`);
    default:
      return rpcError;
  }
}
