import { create } from '@bufbuild/protobuf';
import {
  address,
  byteSize,
  carried,
  checkCarried,
  ConfigError,
  type Env,
  host,
  nonNegativeInt,
  parseEnv,
  port,
  positiveInt,
  redisUrl,
  serviceAddress,
} from '@infermesh/config';
import { MAX_DEADLINE_MS } from '@infermesh/grpc';
import { type RateLimit, RateLimitSchema, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import type { StoreDownPolicy } from '@infermesh/rate-limit';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { resolve } from 'node:path';
import { z } from 'zod';
import { parseKey } from './auth/api-keys/api-key-secret';
import { DEFAULT_TENSOR_LIMITS, type TensorLimits } from './inference/tensor-limits';

/** The scopes by their names in GATEWAY_API_KEYS: `infer` (inference, model metadata) and `admin` (the admin API). */
export const SCOPE_NAMES: ReadonlyMap<string, Scope> = new Map([
  ['infer', Scope.INFER],
  ['admin', Scope.ADMIN],
]);

/** The name of a scope in GATEWAY_API_KEYS and in messages. */
export function scopeName(scope: Scope): string {
  return [...SCOPE_NAMES].find(([, s]) => s === scope)?.[0] ?? Scope[scope];
}

/** A key of GATEWAY_API_KEYS and what it may do. */
export interface ConfiguredApiKey {
  readonly key: string;
  readonly scopes: readonly Scope[];
}

/** The largest rate a limit may name, as for stored keys. */
const MAX_RATE = 1_000_000;

const API_KEYS_SYNTAX =
  'a comma-separated list of KEY (every scope) or KEY:SCOPE[+SCOPE] entries, the scopes being infer and admin';

const shape = {
  ...runtimeShape('GATEWAY', { grpc: 8001, metrics: 8002 }),
  GATEWAY_HTTP_HOST: host('127.0.0.1'),
  GATEWAY_HTTP_PORT: port(8000),
  GATEWAY_ROUTER_ADDRESS: serviceAddress('127.0.0.1:50052'),
  GATEWAY_ROUTER_CARRIED: carried(),
  GATEWAY_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  // Only the missing case fails inside zod: its errors quote the value, and keys are never printed.
  GATEWAY_API_KEYS: z
    .string({ error: `required: ${API_KEYS_SYNTAX}` })
    .transform((value) => value.split(',').map((entry) => entry.trim())),
  GATEWAY_REQUEST_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_MAX_REQUEST_TIMEOUT_MS: z.coerce
    .number()
    .int()
    .positive()
    .max(MAX_DEADLINE_MS, `at most ${MAX_DEADLINE_MS} (24 days): no call can have a longer deadline`)
    .default(10 * 60_000),
  GATEWAY_GRPC_RECEIVE_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_GRPC_SEND_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_HTTP_SEND_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_HTTP_RECEIVE_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_GRPC_MAX_STREAMS_PER_CONNECTION: positiveInt(1_024),
  GATEWAY_GRPC_MAX_CALLS_AWAITING_REQUEST: positiveInt(10_000),
  GATEWAY_MAX_BODY_BYTES: positiveInt(64 * 1024 * 1024),
  GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: byteSize('256MiB'),
  GATEWAY_MAX_NAME_BYTES: positiveInt(DEFAULT_TENSOR_LIMITS.maxNameBytes),
  GATEWAY_MAX_IN_FLIGHT: positiveInt(1_024),
  GATEWAY_MIN_IN_FLIGHT: positiveInt(16),
  GATEWAY_CONCURRENCY_LIMIT: z.enum(['adaptive', 'fixed']).default('adaptive'),
  GATEWAY_MAX_INPUTS: positiveInt(DEFAULT_TENSOR_LIMITS.maxInputs),
  GATEWAY_MAX_TENSOR_ELEMENTS: positiveInt(DEFAULT_TENSOR_LIMITS.maxTensorElements),
  GATEWAY_MAX_BATCH_SIZE: positiveInt(DEFAULT_TENSOR_LIMITS.maxBatchSize),
  REDIS_URL: redisUrl(),
  GATEWAY_DATA_DIR: z.string().min(1).default('.infermesh/gateway'),
  GATEWAY_API_KEY_CACHE_MS: nonNegativeInt(1_000),
  GATEWAY_RATE_LIMIT_RPS: requestRate(),
  GATEWAY_RATE_LIMIT_BURST: nonNegativeInt(0),
  GATEWAY_RATE_LIMIT_PER_MODEL_RPS: requestRate(),
  GATEWAY_RATE_LIMIT_PER_MODEL_BURST: nonNegativeInt(0),
  GATEWAY_RATE_LIMIT_REDIS_DOWN: z.enum(['local', 'open', 'closed']).default('local'),
};

/** A number of requests per second, 0 (the default) for no limit. */
function requestRate() {
  return z.coerce.number().finite().min(0).max(MAX_RATE, `at most ${MAX_RATE} requests per second`).default(0);
}

/**
 * The API keys of GATEWAY_API_KEYS: `KEY` has every scope, `KEY:SCOPE[+SCOPE]` the ones it names.
 * Problems name the entry by its position in the list (1 for the first), never by its text: a key
 * is never printed, not even a part of it mistaken for a scope. Empty entries are skipped.
 */
function parseApiKeys(entries: string[]): ConfiguredApiKey[] {
  const problems: string[] = [];
  const keys: ConfiguredApiKey[] = [];
  const positions = new Map<string, number>();
  for (const [index, entry] of entries.entries()) {
    if (entry === '') continue;
    const position = index + 1;
    const colon = entry.indexOf(':');
    const key = (colon < 0 ? entry : entry.slice(0, colon)).trim();
    const named =
      colon < 0
        ? [...SCOPE_NAMES.keys()]
        : entry
            .slice(colon + 1)
            .split('+')
            .map((s) => s.trim());
    if (key === '') {
      problems.push(`GATEWAY_API_KEYS: entry ${position} has no key before its scopes; expected ${API_KEYS_SYNTAX}`);
      continue;
    }
    if (parseKey(key) !== undefined) {
      problems.push(
        `GATEWAY_API_KEYS: entry ${position} has the format of a stored key (im_<id>_<secret>); create such keys with the admin API, or configure another key`,
      );
      continue;
    }
    if (named.some((s) => !SCOPE_NAMES.has(s))) {
      problems.push(`GATEWAY_API_KEYS: entry ${position} names an unknown or empty scope; expected ${API_KEYS_SYNTAX}`);
      continue;
    }
    const earlier = positions.get(key);
    if (earlier !== undefined) {
      problems.push(
        `GATEWAY_API_KEYS: entry ${position} repeats the key of entry ${earlier}; give each key once with all its scopes`,
      );
      continue;
    }
    positions.set(key, position);
    keys.push({ key, scopes: [...SCOPE_NAMES].filter(([name]) => named.includes(name)).map(([, scope]) => scope) });
  }
  if (problems.length > 0) throw new ConfigError(problems);
  if (keys.length === 0)
    throw new ConfigError([`GATEWAY_API_KEYS: required: ${API_KEYS_SYNTAX} (got only separators)`]);
  return keys;
}

/**
 * The limits of GATEWAY_RATE_LIMIT_*: those of the configured keys, and of stored keys created
 * without limits of their own. A burst without its rate would limit nothing and is refused.
 */
function defaultRateLimit(e: {
  [K in `GATEWAY_RATE_LIMIT_${'RPS' | 'BURST' | 'PER_MODEL_RPS' | 'PER_MODEL_BURST'}`]: number;
}): RateLimit {
  const problems: string[] = [];
  if (e.GATEWAY_RATE_LIMIT_BURST > 0 && e.GATEWAY_RATE_LIMIT_RPS === 0) {
    problems.push('GATEWAY_RATE_LIMIT_BURST: set GATEWAY_RATE_LIMIT_RPS too: without a rate there is no limit per key');
  }
  if (e.GATEWAY_RATE_LIMIT_PER_MODEL_BURST > 0 && e.GATEWAY_RATE_LIMIT_PER_MODEL_RPS === 0) {
    problems.push(
      'GATEWAY_RATE_LIMIT_PER_MODEL_BURST: set GATEWAY_RATE_LIMIT_PER_MODEL_RPS too: without a rate there is no limit per model',
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return create(RateLimitSchema, {
    requestsPerSecond: e.GATEWAY_RATE_LIMIT_RPS,
    burst: e.GATEWAY_RATE_LIMIT_BURST,
    perModelRequestsPerSecond: e.GATEWAY_RATE_LIMIT_PER_MODEL_RPS,
    perModelBurst: e.GATEWAY_RATE_LIMIT_PER_MODEL_BURST,
  });
}

/** Settings that bound one another: a default above its maximum, a body that could never fit the budget. */
function checkBounds(e: {
  GATEWAY_REQUEST_TIMEOUT_MS: number;
  GATEWAY_MAX_REQUEST_TIMEOUT_MS: number;
  GATEWAY_MAX_BODY_BYTES: number;
  GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: number;
  GATEWAY_MAX_MESSAGE_BYTES: number;
}): void {
  const problems: string[] = [];
  if (e.GATEWAY_REQUEST_TIMEOUT_MS > e.GATEWAY_MAX_REQUEST_TIMEOUT_MS) {
    problems.push(
      `GATEWAY_REQUEST_TIMEOUT_MS: the default deadline (${e.GATEWAY_REQUEST_TIMEOUT_MS}) is longer than GATEWAY_MAX_REQUEST_TIMEOUT_MS (${e.GATEWAY_MAX_REQUEST_TIMEOUT_MS})`,
    );
  }
  if (e.GATEWAY_MAX_BODY_BYTES > e.GATEWAY_MAX_BODY_BYTES_IN_FLIGHT) {
    problems.push(
      `GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: ${e.GATEWAY_MAX_BODY_BYTES_IN_FLIGHT} bytes cannot hold one body of GATEWAY_MAX_BODY_BYTES (${e.GATEWAY_MAX_BODY_BYTES})`,
    );
  }
  if (e.GATEWAY_MAX_MESSAGE_BYTES > e.GATEWAY_MAX_BODY_BYTES_IN_FLIGHT) {
    problems.push(
      `GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: ${e.GATEWAY_MAX_BODY_BYTES_IN_FLIGHT} bytes cannot hold one gRPC message of GATEWAY_MAX_MESSAGE_BYTES (${e.GATEWAY_MAX_MESSAGE_BYTES})`,
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
}

/** The gateway's configuration, validated once at start-up. Relative paths resolve against the working directory. */
export function loadGatewayConfig(env: Env) {
  const e = parseEnv(shape, env);
  checkBounds(e);
  const dataDir = resolve(e.GATEWAY_DATA_DIR);
  return {
    runtime: runtimeSettings('GATEWAY', e),
    http: {
      host: e.GATEWAY_HTTP_HOST,
      port: e.GATEWAY_HTTP_PORT,
      /** A REST response must have left whole this long after it began (else its connection is closed). */
      sendTimeoutMs: e.GATEWAY_HTTP_SEND_TIMEOUT_MS,
      /** A REST request's body must have arrived whole this long after its headers (else 408, and its connection closed). */
      receiveTimeoutMs: e.GATEWAY_HTTP_RECEIVE_TIMEOUT_MS,
    },
    routerAddress: e.GATEWAY_ROUTER_ADDRESS,
    /** Inference calls to the router go carried on one stream (RouterService/Infers), not each a call of its own. */
    routerCarried: checkCarried(
      'GATEWAY_ROUTER_CARRIED',
      e.GATEWAY_ROUTER_CARRIED,
      'GATEWAY_ROUTER_ADDRESS',
      e.GATEWAY_ROUTER_ADDRESS,
    ),
    registryAddress: e.GATEWAY_REGISTRY_ADDRESS,
    apiKeys: parseApiKeys(e.GATEWAY_API_KEYS),
    /** The deadline of a request that brings none (streaming admin calls excepted: they have only the caller's). */
    defaultTimeoutMs: e.GATEWAY_REQUEST_TIMEOUT_MS,
    /** The longest deadline a request gets: longer ones (gRPC deadline, x-request-timeout-ms, `timeout`) are cut to it. */
    maxTimeoutMs: e.GATEWAY_MAX_REQUEST_TIMEOUT_MS,
    /** Bounds of the public gRPC port against clients that open calls and never send them, or never read their answers. */
    grpc: {
      /** A unary call's request must have arrived whole this long after its headers (else DEADLINE_EXCEEDED). */
      receiveTimeoutMs: e.GATEWAY_GRPC_RECEIVE_TIMEOUT_MS,
      /** A unary call's answer must have left whole this long after it began (else its stream is reset). */
      sendTimeoutMs: e.GATEWAY_GRPC_SEND_TIMEOUT_MS,
      /** Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). */
      maxConcurrentStreams: e.GATEWAY_GRPC_MAX_STREAMS_PER_CONNECTION,
      /** Calls of all connections together whose request has not arrived whole; past it, the one waiting longest is answered RESOURCE_EXHAUSTED. */
      maxCallsAwaitingRequest: e.GATEWAY_GRPC_MAX_CALLS_AWAITING_REQUEST,
    },
    /** Request body bytes held at once across all requests, REST and gRPC; beyond it, 429 / RESOURCE_EXHAUSTED. */
    maxBodyBytesInFlight: e.GATEWAY_MAX_BODY_BYTES_IN_FLIGHT,
    /** The largest REST request body accepted (artifact uploads excepted: the registry limits those). */
    maxBodyBytes: e.GATEWAY_MAX_BODY_BYTES,
    /**
     * Inference requests this gateway works on at once; more are refused at once (load shedding).
     * Adaptive: the limit follows the latency the router answers in, between min (at most max) and max;
     * fixed: max.
     */
    concurrency: {
      adaptive: e.GATEWAY_CONCURRENCY_LIMIT === 'adaptive',
      min: Math.min(e.GATEWAY_MIN_IN_FLIGHT, e.GATEWAY_MAX_IN_FLIGHT),
      max: e.GATEWAY_MAX_IN_FLIGHT,
    },
    /** What one inference request may hold: inputs, elements per tensor, batch size, name lengths (400 beyond). */
    tensorLimits: {
      maxInputs: e.GATEWAY_MAX_INPUTS,
      maxTensorElements: e.GATEWAY_MAX_TENSOR_ELEMENTS,
      maxBatchSize: e.GATEWAY_MAX_BATCH_SIZE,
      maxNameBytes: e.GATEWAY_MAX_NAME_BYTES,
    } satisfies TensorLimits,
    /** How long a readiness probe of the upstreams may take, and how long its answer is reused. */
    upstreamProbeTimeoutMs: 1_000,
    upstreamProbeCacheMs: 500,
    /** Stored API keys and rate-limit buckets live in Redis when set, shared by every replica. */
    redisUrl: e.REDIS_URL,
    redisKeyPrefix: 'infermesh:',
    dataDir,
    /** The embedded key store's file; unused when REDIS_URL is set. */
    apiKeysFile: resolve(dataDir, 'api-keys.json'),
    /** How long a stored key's lookup is reused: a revocation applies within this time. */
    apiKeyCacheMs: e.GATEWAY_API_KEY_CACHE_MS,
    /** The limits of the configured keys, and of stored keys without limits of their own; 0: none. */
    defaultRateLimit: defaultRateLimit(e),
    /** What applies while Redis cannot be reached: this replica's own buckets, no limit, or refusal. */
    rateLimitRedisDown: e.GATEWAY_RATE_LIMIT_REDIS_DOWN satisfies StoreDownPolicy,
  };
}

export type GatewayConfig = ReturnType<typeof loadGatewayConfig>;
export const GATEWAY_CONFIG = Symbol('GATEWAY_CONFIG');
