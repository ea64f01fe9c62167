import { address, type Env, nonNegativeInt, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { z } from 'zod';

const shape = {
  ...runtimeShape('ROUTER', { grpc: 50052, metrics: 9102 }),
  ROUTER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  ROUTER_CACHE_ADDRESS: address('127.0.0.1:50053'),
  ROUTER_BATCHER_ADDRESS: address('127.0.0.1:50054'),
  ROUTER_RESOLVE_TTL_MS: nonNegativeInt(1_000),
  ROUTER_CACHE_ENABLED: z.enum(['true', 'false']).default('true'),
  ROUTER_CACHE_TIMEOUT_MS: positiveInt(100),
  ROUTER_CACHE_TTL_MS: nonNegativeInt(0),
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
    /** How long a resolved model version is reused before asking the registry again. */
    resolveTtlMs: e.ROUTER_RESOLVE_TTL_MS,
    cache: {
      enabled: e.ROUTER_CACHE_ENABLED === 'true',
      /** Budget of a lookup; past it the request goes on without the cache. */
      timeoutMs: e.ROUTER_CACHE_TIMEOUT_MS,
      /** 0 uses the cache service's default. */
      ttlMs: e.ROUTER_CACHE_TTL_MS,
    },
  };
}

export type RouterConfig = ReturnType<typeof loadRouterConfig>;
export const ROUTER_CONFIG = Symbol('ROUTER_CONFIG');
