import { type Env, parseEnv, positiveInt, redisUrl } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';

const shape = {
  ...runtimeShape('CACHE', { grpc: 50053, metrics: 9103 }),
  REDIS_URL: redisUrl(),
  CACHE_DEFAULT_TTL_MS: positiveInt(5 * 60_000),
  CACHE_MAX_ENTRY_BYTES: positiveInt(4 * 1024 * 1024),
  CACHE_MAX_BYTES: positiveInt(256 * 1024 * 1024),
};

/** The cache service's configuration, validated once at start-up. */
export function loadCacheConfig(env: Env) {
  const e = parseEnv(shape, env);
  return {
    runtime: runtimeSettings('CACHE', e),
    redisUrl: e.REDIS_URL,
    defaultTtlMs: e.CACHE_DEFAULT_TTL_MS,
    maxEntryBytes: e.CACHE_MAX_ENTRY_BYTES,
    /** Memory budget of the embedded store; Redis manages its own with maxmemory. */
    maxBytes: e.CACHE_MAX_BYTES,
    redisKeyPrefix: 'infermesh:cache:',
  };
}

export type CacheConfig = ReturnType<typeof loadCacheConfig>;
export const CACHE_CONFIG = Symbol('CACHE_CONFIG');
