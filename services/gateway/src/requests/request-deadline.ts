import { Errors } from '@infermesh/grpc';

/** The header a REST client sets to give its request a deadline, in milliseconds from now. */
export const TIMEOUT_HEADER = 'x-request-timeout-ms';

/** What a request says about its deadline, each in milliseconds; undefined where it says nothing. */
export interface DeadlineSources {
  /** The gRPC deadline, epoch milliseconds. */
  grpcDeadlineMs?: number | undefined;
  /** The `x-request-timeout-ms` header. */
  headerTimeoutMs?: number | undefined;
  /** Triton's `timeout` parameter. */
  parameterTimeoutMs?: number | undefined;
}

/**
 * A request's deadline, epoch milliseconds: the earliest it names (gRPC deadline, header, `timeout`
 * parameter), else `defaultMs` from `now`; never more than `maxMs` from `now`
 * (GATEWAY_MAX_REQUEST_TIMEOUT_MS). `now` is the wall clock's time (Clock.now()), epoch milliseconds.
 */
export function requestDeadline(
  sources: DeadlineSources,
  limits: { defaultMs: number; maxMs: number },
  now: number,
): number {
  const given = [
    sources.grpcDeadlineMs,
    sources.headerTimeoutMs === undefined ? undefined : now + sources.headerTimeoutMs,
    sources.parameterTimeoutMs === undefined ? undefined : now + sources.parameterTimeoutMs,
  ].filter((d): d is number => d !== undefined);
  const deadline = given.length > 0 ? Math.min(...given) : now + limits.defaultMs;
  return Math.min(deadline, now + limits.maxMs);
}

/**
 * The `x-request-timeout-ms` header in milliseconds; undefined when absent. Any positive whole number
 * is taken (a long one is cut to the maximum later); anything else is an INVALID_ARGUMENT naming it.
 */
export function headerTimeoutMs(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (!/^\d{1,30}$/.test(text) || Number(text) <= 0) {
    throw Errors.invalidRequest(
      `${TIMEOUT_HEADER} must be a positive integer of milliseconds, got ${JSON.stringify(text.slice(0, 40))}`,
    );
  }
  return Number(text);
}
