import { address, ConfigError, type Env, host, parseEnv, port, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { z } from 'zod';

const shape = {
  ...runtimeShape('GATEWAY', { grpc: 8001, metrics: 8002 }),
  GATEWAY_HTTP_HOST: host('127.0.0.1'),
  GATEWAY_HTTP_PORT: port(8000),
  GATEWAY_ROUTER_ADDRESS: address('127.0.0.1:50052'),
  GATEWAY_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  // Only the missing case fails inside zod: its errors quote the value, and keys are never printed.
  GATEWAY_API_KEYS: z
    .string({ error: 'required: a comma-separated list of the API keys clients may present' })
    .transform((value) => value.split(',').map((key) => key.trim()).filter((key) => key.length > 0)),
  GATEWAY_REQUEST_TIMEOUT_MS: positiveInt(30_000),
  GATEWAY_MAX_BODY_BYTES: positiveInt(64 * 1024 * 1024),
  GATEWAY_MAX_IN_FLIGHT: positiveInt(1_024),
};

/** The gateway's configuration, validated once at start-up. */
export function loadGatewayConfig(env: Env) {
  const e = parseEnv(shape, env);
  if (e.GATEWAY_API_KEYS.length === 0) {
    throw new ConfigError(['GATEWAY_API_KEYS: required: a comma-separated list of the API keys clients may present (got only separators)']);
  }
  return {
    runtime: runtimeSettings('GATEWAY', e),
    http: { host: e.GATEWAY_HTTP_HOST, port: e.GATEWAY_HTTP_PORT },
    routerAddress: e.GATEWAY_ROUTER_ADDRESS,
    registryAddress: e.GATEWAY_REGISTRY_ADDRESS,
    apiKeys: e.GATEWAY_API_KEYS,
    /** The deadline of a request that brings none. */
    defaultTimeoutMs: e.GATEWAY_REQUEST_TIMEOUT_MS,
    /** The largest REST request body accepted. */
    maxBodyBytes: e.GATEWAY_MAX_BODY_BYTES,
    /** Inference requests this gateway works on at once; more are refused at once (load shedding). */
    maxInFlight: e.GATEWAY_MAX_IN_FLIGHT,
    /** How long a readiness probe of the upstreams may take, and how long its answer is reused. */
    upstreamProbeTimeoutMs: 1_000,
    upstreamProbeCacheMs: 500,
  };
}

export type GatewayConfig = ReturnType<typeof loadGatewayConfig>;
export const GATEWAY_CONFIG = Symbol('GATEWAY_CONFIG');
