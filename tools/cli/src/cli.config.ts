import {
  address,
  ConfigError,
  type Env,
  host,
  logLevel,
  parseEnv,
  redisUrl,
  tracingSettings,
  tracingShape,
} from '@infermesh/config';
import { z } from 'zod';

const shape = {
  INFERMESH_API_KEY: z
    .string()
    .min(16, 'must be at least 16 characters')
    // The gateway reads its keys as a comma-separated list of KEY[:SCOPES] entries.
    .regex(/^[^,:\s]+$/, 'must not contain commas, colons or spaces')
    .optional(),
  INFERMESH_HOST: host('127.0.0.1'),
  INFERMESH_DATA_DIR: z.string().min(1).default('.infermesh'),
  INFERMESH_DEMO_MODELS: z
    .string()
    .default('mlp,tiny,multi-io,classifier')
    .transform((v) =>
      v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s.length > 0),
    ),
  INFERMESH_LOG_LEVEL: logLevel(),
  INFERMESH_READY_TIMEOUT_MS: z.coerce.number().int().positive().default(120_000),
  INFERMESH_MESH: z.enum(['static', 'xds']).default('xds'),
  INFERMESH_MESH_POLICY: z.string().min(1).optional(),
  // Mutual TLS between the services, each with a SPIFFE identity from a local CA (the mesh only).
  INFERMESH_MTLS: z.enum(['true', 'false']).optional(),
  INFERMESH_IDENTITY_LIFETIME_MS: z.coerce
    .number()
    .int()
    .min(10_000)
    .default(4 * 3_600_000),
  REDIS_URL: redisUrl(),
  // Read by every service; checked here first, so that a bad value stops `up` before anything starts.
  ...tracingShape,
};

/** The launcher's configuration (`infermesh up`), validated once. */
export function loadCliConfig(env: Env) {
  const e = parseEnv(shape, env);
  if (e.INFERMESH_MTLS === 'true' && e.INFERMESH_MESH !== 'xds') {
    throw new ConfigError([
      'INFERMESH_MTLS: mutual TLS needs the mesh (INFERMESH_MESH=xds), whose policy says which service may call which',
    ]);
  }
  return {
    apiKey: e.INFERMESH_API_KEY,
    host: e.INFERMESH_HOST,
    dataDir: e.INFERMESH_DATA_DIR,
    demoModels: e.INFERMESH_DEMO_MODELS,
    logLevel: e.INFERMESH_LOG_LEVEL,
    readyTimeoutMs: e.INFERMESH_READY_TIMEOUT_MS,
    /** static: services dial each other's addresses; xds: through the mesh, the registry serving the policy. */
    mesh: e.INFERMESH_MESH,
    /** The mesh policy for xds (default: envoy/mesh.yaml of this repository). */
    meshPolicy: e.INFERMESH_MESH_POLICY,
    /** Mutual TLS between the services: on by default in the mesh; needs it. */
    mtls: e.INFERMESH_MTLS === undefined ? e.INFERMESH_MESH === 'xds' : e.INFERMESH_MTLS === 'true',
    /** How long each instance's certificate is valid; it is issued again at half-life. */
    identityLifetimeMs: e.INFERMESH_IDENTITY_LIFETIME_MS,
    redisUrl: e.REDIS_URL,
    /** Where the services export their traces, and which (undefined: tracing off). */
    tracing: tracingSettings(e),
  };
}

export type CliConfig = ReturnType<typeof loadCliConfig>;

// The admin commands (`infermesh models`, `infermesh rollout`) call the gateway's admin API. The key
// they present is only checked to be there: the gateway decides whether it is accepted (`up` above
// insists on 16 characters because it sets the key).
const gatewayShape = {
  INFERMESH_GATEWAY: address('127.0.0.1:8001'),
  INFERMESH_API_KEY: z.string().min(1, 'must not be empty').optional(),
};

/** Flags that override the environment: --gateway and --api-key. */
export interface GatewayFlags {
  gateway?: string | undefined;
  apiKey?: string | undefined;
}

/**
 * Where the admin commands reach the gateway and the key they present, validated once: a flag wins
 * over its variable (and the variable it overrides is not read). The key may still be missing; the
 * command says so.
 */
export function loadGatewayClientConfig(env: Env, flags: GatewayFlags) {
  const e = parseEnv(gatewayShape, {
    INFERMESH_GATEWAY: flags.gateway === undefined ? env['INFERMESH_GATEWAY'] : undefined,
    INFERMESH_API_KEY: flags.apiKey === undefined ? env['INFERMESH_API_KEY'] : undefined,
  });
  return {
    gateway:
      flags.gateway === undefined
        ? e.INFERMESH_GATEWAY
        : checkFlag('--gateway', gatewayShape.INFERMESH_GATEWAY, flags.gateway),
    apiKey:
      flags.apiKey === undefined
        ? e.INFERMESH_API_KEY
        : checkFlag('--api-key', gatewayShape.INFERMESH_API_KEY, flags.apiKey),
  };
}

export type GatewayClientConfig = ReturnType<typeof loadGatewayClientConfig>;

function checkFlag<T>(flag: string, schema: z.ZodType<T>, value: string): T {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  throw new ConfigError(result.error.issues.map((issue) => `${flag}: ${issue.message} (got ${JSON.stringify(value)})`));
}
