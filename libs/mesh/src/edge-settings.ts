import { durationMs } from './envoy-api-check';
import { type OutlierDetection, RETRIABLE_GRPC_CODES } from './mesh-policy';

type Json = Record<string, unknown>;

/** How a caller that picks endpoints itself (the batcher, of workers) retries on an edge. */
export interface EdgeRetry {
  /** gRPC status names retried (`unavailable`, …). */
  on: readonly (typeof RETRIABLE_GRPC_CODES)[number][];
  /** Attempts in all, the first included; 1: no retry. */
  attempts: number;
  backoff: { baseMs: number; maxMs: number };
  perTryTimeoutMs: number | undefined;
}

const RETRIABLE_BY_CODE: Readonly<Record<number, EdgeRetry['on'][number]>> = {
  1: 'cancelled',
  4: 'deadline-exceeded',
  8: 'resource-exhausted',
  13: 'internal',
  14: 'unavailable',
};

/** Whether a retry policy retries a call that ended with this gRPC status code. */
export function retries(retry: EdgeRetry, code: number): boolean {
  const name = RETRIABLE_BY_CODE[code];
  return name !== undefined && retry.on.includes(name);
}

/** The wait before retry number `n` (from 0): full jitter, random up to base × 2^n, at most max. */
export function retryBackoffMs(retry: EdgeRetry, n: number, random = Math.random): number {
  return random() * Math.min(retry.backoff.maxMs, retry.backoff.baseMs * 2 ** n);
}

const num = (value: unknown, fallback: number): number => (value === undefined ? fallback : Number(value));

/**
 * The retry policy of an edge's default route (the last of its API listener's routes), read back
 * from what the control plane serves, for a caller that picks endpoints itself. Throws naming what
 * it cannot read, so that the update is refused.
 */
export function edgeRetryOf(resource: unknown, at = 'listener'): EdgeRetry {
  const listener = (resource ?? {}) as Json;
  const hcm = (listener['api_listener'] as Json | undefined)?.['api_listener'] as Json | undefined;
  const routes = (((hcm?.['route_config'] as Json | undefined)?.['virtual_hosts'] as Json[] | undefined)?.[0]?.[
    'routes'
  ] ?? []) as Json[];
  const action = routes.at(-1)?.['route'] as Json | undefined;
  if (action === undefined) throw new Error(`${at}: no route`);
  const policy = action['retry_policy'] as Json | undefined;
  if (policy === undefined)
    return { on: [], attempts: 1, backoff: { baseMs: 25, maxMs: 250 }, perTryTimeoutMs: undefined };
  const on = (typeof policy['retry_on'] === 'string' ? policy['retry_on'] : '')
    .split(',')
    .map((c) => c.trim())
    .filter((c) => c !== '');
  for (const code of on) {
    if (!(RETRIABLE_GRPC_CODES as readonly string[]).includes(code))
      throw new Error(`${at}.retry_policy.retry_on: ${code} is not a gRPC status this caller retries on`);
  }
  const backoff = (policy['retry_back_off'] ?? {}) as Json;
  const baseMs =
    backoff['base_interval'] === undefined
      ? 25
      : durationMs(backoff['base_interval'], `${at}.retry_policy.retry_back_off.base_interval`);
  return {
    on: on as EdgeRetry['on'],
    attempts: num(policy['num_retries'], 1) + 1,
    backoff: {
      baseMs,
      maxMs:
        backoff['max_interval'] === undefined
          ? baseMs * 10
          : durationMs(backoff['max_interval'], `${at}.retry_policy.retry_back_off.max_interval`),
    },
    perTryTimeoutMs:
      policy['per_try_timeout'] === undefined
        ? undefined
        : durationMs(policy['per_try_timeout'], `${at}.retry_policy.per_try_timeout`),
  };
}

/**
 * A cluster's outlier detection in the policy's terms (Envoy's defaults where a field is unset; a
 * rule not enforced is off). Throws naming what it cannot read.
 */
export function outlierDetectionOf(resource: unknown, at = 'cluster'): OutlierDetection {
  const cluster = (resource ?? {}) as Json;
  const od = (cluster['outlier_detection'] ?? {}) as Json;
  const enforced = (field: string) => num(od[field], 100) > 0;
  return {
    consecutiveFailures: enforced('enforcing_consecutive_5xx') ? num(od['consecutive_5xx'], 5) : 0,
    consecutiveGatewayFailures:
      num(od['enforcing_consecutive_gateway_failure'], 0) > 0 ? num(od['consecutive_gateway_failure'], 5) : 0,
    interval: od['interval'] === undefined ? 10_000 : durationMs(od['interval'], `${at}.outlier_detection.interval`),
    baseEjectionTime:
      od['base_ejection_time'] === undefined
        ? 30_000
        : durationMs(od['base_ejection_time'], `${at}.outlier_detection.base_ejection_time`),
    maxEjectionPercent: num(od['max_ejection_percent'], 10),
    ...(num(od['enforcing_failure_percentage'], 0) > 0 && {
      failurePercentage: {
        threshold: num(od['failure_percentage_threshold'], 85),
        minimumHosts: num(od['failure_percentage_minimum_hosts'], 5),
        requestVolume: num(od['failure_percentage_request_volume'], 50),
      },
    }),
    ...(enforced('enforcing_success_rate') && {
      successRate: {
        stdevFactor: num(od['success_rate_stdev_factor'], 1900),
        minimumHosts: num(od['success_rate_minimum_hosts'], 5),
        requestVolume: num(od['success_rate_request_volume'], 100),
      },
    }),
  };
}
