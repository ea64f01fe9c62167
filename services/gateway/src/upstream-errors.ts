import { status } from '@grpc/grpc-js';
import { RpcError, toRpcError } from '@infermesh/grpc';
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
      return new RpcError(status.UNAVAILABLE, `the ${upstream} is unavailable; retry later`, {
        reason: 'UPSTREAM_UNAVAILABLE',
      });
    case status.DEADLINE_EXCEEDED:
      return new RpcError(status.DEADLINE_EXCEEDED, `the request deadline passed while waiting for the ${upstream}`, {
        reason: 'DEADLINE_EXCEEDED',
      });
    case status.CANCELLED:
      return new RpcError(status.CANCELLED, 'the request was cancelled');
    case status.INTERNAL:
    case status.UNKNOWN:
      logger.error(`${upstream} call failed`, { code: status[rpcError.code], err: rpcError.message });
      return new RpcError(status.INTERNAL, `the ${upstream} failed`, { reason: 'INTERNAL' });
    default:
      return rpcError;
  }
}
