import {
  address,
  byteSize,
  carried,
  checkCarried,
  type Env,
  nonNegativeInt,
  parseEnv,
  positiveInt,
  serviceAddress,
} from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { z } from 'zod';

const shape = {
  ...runtimeShape('ROUTER', { grpc: 50052, metrics: 9102 }),
  ROUTER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  ROUTER_CACHE_ADDRESS: serviceAddress('127.0.0.1:50053'),
  ROUTER_BATCHER_ADDRESS: serviceAddress('127.0.0.1:50054'),
  ROUTER_BATCHER_CARRIED: carried(),
  ROUTER_RESOLVE_TTL_MS: nonNegativeInt(1_000),
  ROUTER_CACHE_ENABLED: z.enum(['true', 'false']).default('true'),
  ROUTER_CACHE_TIMEOUT_MS: positiveInt(100),
  ROUTER_CACHE_TTL_MS: nonNegativeInt(0),
  ROUTER_CACHE_PER_TENANT: z.enum(['true', 'false']).default('true'),
  ROUTER_LOCAL_CACHE_ENABLED: z.enum(['true', 'false']).default('true'),
  ROUTER_LOCAL_CACHE_BYTES: byteSize(64 * 1024 * 1024),
  ROUTER_LOCAL_CACHE_TTL_MS: positiveInt(30_000),
  ROUTER_BREAKER_FAILURES: positiveInt(5),
  ROUTER_BREAKER_COOLDOWN_MS: positiveInt(5_000),
  ROUTER_BREAKER_TIMEOUT_MIN_BUDGET_MS: positiveInt(1_000),
  ROUTER_RETRY_ATTEMPTS: nonNegativeInt(2),
  ROUTER_RETRY_BASE_MS: positiveInt(25),
  ROUTER_RETRY_MAX_MS: positiveInt(250),
  ROUTER_SHADOW_TIMEOUT_MS: positiveInt(10_000),
  ROUTER_TRAFFIC_REPORT_INTERVAL_MS: positiveInt(1_000),
};

/** The router's configuration, validated once at start-up. */
export function loadRouterConfig(env: Env) {
  const e = parseEnv(shape, env);
  return {
    runtime: runtimeSettings('ROUTER', e),
    upstreams: {
      registry: e.ROUTER_REGISTRY_ADDRESS,
      cache: e.ROUTER_CACHE_ADDRESS,
      batcher: e.ROUTER_BATCHER_ADDRESS,
    },
    /** Calls to the batcher go carried on one stream (BatcherService/Infers), not each a call of its own. */
    batcherCarried: checkCarried(
      'ROUTER_BATCHER_CARRIED',
      e.ROUTER_BATCHER_CARRIED,
      'ROUTER_BATCHER_ADDRESS',
      e.ROUTER_BATCHER_ADDRESS,
    ),
    /** How long a resolved model version is reused before asking the registry again. */
    resolveTtlMs: e.ROUTER_RESOLVE_TTL_MS,
    cache: {
      enabled: e.ROUTER_CACHE_ENABLED === 'true',
      /** Budget of a lookup; past it the request goes on without the cache. */
      timeoutMs: e.ROUTER_CACHE_TIMEOUT_MS,
      /** 0 uses the cache service's default. */
      ttlMs: e.ROUTER_CACHE_TTL_MS,
      /** Keys entries by tenant (the caller's API key digest) too: no tenant is answered from another's entries. */
      perTenant: e.ROUTER_CACHE_PER_TENANT === 'true',
      /** The router's own cache in front of the shared one: its byte budget (0 when off) and how long an entry lives there. */
      local: {
        maxBytes: e.ROUTER_LOCAL_CACHE_ENABLED === 'true' ? e.ROUTER_LOCAL_CACHE_BYTES : 0,
        ttlMs: e.ROUTER_LOCAL_CACHE_TTL_MS,
      },
    },
    /**
     * Per model version: consecutive failures of its own that open its circuit, how long it stays
     * open, and the shortest budget whose timeout counts as its failure (see verdictOf).
     */
    breaker: {
      failureThreshold: e.ROUTER_BREAKER_FAILURES,
      cooldownMs: e.ROUTER_BREAKER_COOLDOWN_MS,
      timeoutMinBudgetMs: e.ROUTER_BREAKER_TIMEOUT_MIN_BUDGET_MS,
    },
    /** Retries of an UNAVAILABLE batcher answer: at most `attempts`, waiting a random time up to base·2^n ms (at most max). */
    retry: { attempts: e.ROUTER_RETRY_ATTEMPTS, baseMs: e.ROUTER_RETRY_BASE_MS, maxMs: e.ROUTER_RETRY_MAX_MS },
    /** Deadline of a mirrored request on a shadow version. */
    shadowTimeoutMs: e.ROUTER_SHADOW_TIMEOUT_MS,
    /** How often what each version served is reported to the registry (ReportTraffic), for its automatic rollouts. */
    trafficReportIntervalMs: e.ROUTER_TRAFFIC_REPORT_INTERVAL_MS,
  };
}

export type RouterConfig = ReturnType<typeof loadRouterConfig>;
export const ROUTER_CONFIG = Symbol('ROUTER_CONFIG');
