import { byteSize, ConfigError, type Env, nonNegativeInt, parseEnv, positiveInt, redisUrl } from '@infermesh/config';
import { MeshPolicyError, parseMeshPolicy } from '@infermesh/mesh';
import { readFileSync } from 'node:fs';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { resolve } from 'node:path';
import { z } from 'zod';

const path = () => z.string().min(1).optional();

const shape = {
  ...runtimeShape('REGISTRY', { grpc: 50051, metrics: 9101 }),
  REDIS_URL: redisUrl(),
  REGISTRY_DATA_DIR: path(),
  REGISTRY_ARTIFACT_DIR: path(),
  REGISTRY_MAX_ARTIFACT_BYTES: byteSize('2GiB'),
  // A derivation holds about five times its source at once (the bytes, the decoded graph, the
  // variant, and two sessions): the default fits a registry with 1 GiB of memory.
  REGISTRY_MAX_DERIVATION_BYTES: byteSize('128MiB'),
  REGISTRY_MAX_QUEUED_DERIVATIONS: nonNegativeInt(4),
  REGISTRY_DEFAULT_MAX_BATCH_SIZE: positiveInt(64),
  REGISTRY_DRAIN_GRACE_MS: nonNegativeInt(10_000),
  REGISTRY_WATCH_POLL_MS: positiveInt(250),
  REGISTRY_MESH_POLICY: path(),
  REGISTRY_MESH_POLICY_POLL_MS: positiveInt(1_000),
  REGISTRY_INSTANCE_TIMEOUT_MS: positiveInt(15_000),
  REGISTRY_ROLLOUT_TICK_MS: positiveInt(1_000),
  PROMETHEUS_URL: z
    .string()
    .url()
    .refine((url) => /^https?:\/\//.test(url), 'must be an http:// or https:// URL')
    .optional(),
  // grpc-js-xds's own xDS client speaks only plaintext to its control plane: with mutual TLS on the
  // registry's port, proxyless clients on this machine take xDS from this loopback port instead.
  REGISTRY_XDS_PLAINTEXT_PORT: z.coerce.number().int().min(0).max(65535).optional(),
};

/** The registry's configuration, validated once at start-up. Relative paths resolve against the working directory. */
export function loadRegistryConfig(env: Env) {
  const e = parseEnv(shape, env);
  const dataDir = resolve(e.REGISTRY_DATA_DIR ?? '.infermesh/registry');
  const runtime = runtimeSettings('REGISTRY', e);
  const meshPolicyPath = e.REGISTRY_MESH_POLICY === undefined ? undefined : resolve(e.REGISTRY_MESH_POLICY);
  if (meshPolicyPath !== undefined) {
    try {
      parseMeshPolicy(readFileSync(meshPolicyPath, 'utf8'), meshPolicyPath);
    } catch (error) {
      const problems =
        error instanceof MeshPolicyError ? error.problems : [error instanceof Error ? error.message : String(error)];
      throw new ConfigError(problems.map((p) => `REGISTRY_MESH_POLICY (${meshPolicyPath}): ${p}`));
    }
  }
  if (runtime.tls !== undefined && meshPolicyPath === undefined) {
    throw new ConfigError([
      'INFERMESH_TLS_DIR: mutual TLS needs REGISTRY_MESH_POLICY, whose authorization says which service may call which',
    ]);
  }
  return {
    runtime,
    redisUrl: e.REDIS_URL,
    dataDir,
    /** The embedded metadata store's file; unused when REDIS_URL is set. */
    metadataFile: resolve(dataDir, 'models.json'),
    /** Artifacts always live on the filesystem, addressed by SHA-256, whichever metadata store is used. */
    artifactDir: resolve(e.REGISTRY_ARTIFACT_DIR ?? resolve(dataDir, 'artifacts')),
    /** Uploads larger than this are refused as soon as they pass it. */
    maxArtifactBytes: e.REGISTRY_MAX_ARTIFACT_BYTES,
    maxDerivationBytes: e.REGISTRY_MAX_DERIVATION_BYTES,
    maxQueuedDerivations: e.REGISTRY_MAX_QUEUED_DERIVATIONS,
    /** How long a version that left the serving set drains (DRAINING) before it is RETIRED. */
    drainGraceMs: e.REGISTRY_DRAIN_GRACE_MS,
    /** How often the registry looks for drained versions: a tenth of the grace, from 10 ms to 1 s. */
    drainSweepIntervalMs: Math.min(1_000, Math.max(10, Math.floor(e.REGISTRY_DRAIN_GRACE_MS / 10))),
    /** How often WatchModels looks at the store for changes made by other replicas. */
    watchPollMs: e.REGISTRY_WATCH_POLL_MS,
    /** The max batch size of a model whose inputs and outputs all have a dynamic first dimension. */
    defaultMaxBatchSize: e.REGISTRY_DEFAULT_MAX_BATCH_SIZE,
    /** DownloadArtifact sends the artifact in chunks of 1 MiB, or less when messages must be smaller. */
    downloadChunkBytes: Math.max(1024, Math.min(1024 * 1024, runtime.maxMessageBytes - 1024)),
    redisKeyPrefix: 'infermesh:registry:',
    rollouts: {
      /** How often automatic rollouts in progress are judged. */
      tickMs: e.REGISTRY_ROLLOUT_TICK_MS,
      /** Where automatic rollouts read the routers' metrics; unset: from the routers' own reports (ReportTraffic). */
      prometheusUrl: e.PROMETHEUS_URL,
    },
    mesh: {
      /** The mesh policy served over xDS; unset: no xDS, instances are still tracked. */
      policyPath: meshPolicyPath,
      /** How often the policy file is looked at for changes. */
      policyPollMs: e.REGISTRY_MESH_POLICY_POLL_MS,
      /** An instance silent for this long is withdrawn, even if its stream looks open. */
      instanceTimeoutMs: e.REGISTRY_INSTANCE_TIMEOUT_MS,
      /** Also serve ADS (and nothing else) in plaintext on 127.0.0.1 at this port, for grpc-js-xds clients; unset: not. */
      plaintextXdsPort: e.REGISTRY_XDS_PLAINTEXT_PORT,
    },
  };
}

export type RegistryConfig = ReturnType<typeof loadRegistryConfig>;
export const REGISTRY_CONFIG = Symbol('REGISTRY_CONFIG');
