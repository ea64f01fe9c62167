import { address, addressList, ConfigError, type Env, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { z } from 'zod';
import { REPLICA_CHOICES } from './replica-choice';

const shape = {
  ...runtimeShape('BATCHER', { grpc: 50054, metrics: 9104 }),
  // `mesh`: the workers the mesh's control plane knows (INFERMESH_MESH_CONTROL_PLANE), as they come and go.
  BATCHER_WORKER_ADDRESSES: z.union([z.literal('mesh'), addressList('127.0.0.1:50055')]),
  BATCHER_WORKER_POLL_MS: positiveInt(1_000),
  BATCHER_WORKER_TIMEOUT_MS: positiveInt(2_000),
  BATCHER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  BATCHER_SETTINGS_TTL_MS: positiveInt(5_000),
  BATCHER_MAX_BATCHES_PER_WORKER: positiveInt(2),
  BATCHER_REPLICA_CHOICE: z
    .enum(REPLICA_CHOICES, { error: `expected ${REPLICA_CHOICES.join(' or ')}` })
    .default('least_outstanding'),
  BATCHER_DEFAULT_MAX_QUEUE_DELAY_US: z.coerce.number().int().nonnegative().max(10_000_000).default(1_000),
  BATCHER_DEFAULT_MAX_QUEUE_SIZE: positiveInt(1_000),
};

/** The batcher's configuration, validated once at start-up. */
export function loadBatcherConfig(env: Env) {
  const e = parseEnv(shape, env);
  const runtime = runtimeSettings('BATCHER', e);
  const fromMesh = e.BATCHER_WORKER_ADDRESSES === 'mesh';
  if (fromMesh && runtime.mesh === undefined) {
    throw new ConfigError([
      'BATCHER_WORKER_ADDRESSES: "mesh" takes the workers from the mesh\'s control plane: set INFERMESH_MESH_CONTROL_PLANE too',
    ]);
  }
  return {
    runtime,
    /** The workers this batcher dispatches to; `mesh`: those the control plane knows, polled as they come and go. */
    workerAddresses: fromMesh ? ('mesh' as const) : (e.BATCHER_WORKER_ADDRESSES as string[]),
    /** How often each worker is asked which model versions it has ready. */
    workerPollMs: e.BATCHER_WORKER_POLL_MS,
    /** Budget of a poll. */
    workerTimeoutMs: e.BATCHER_WORKER_TIMEOUT_MS,
    /** The registry: its watch gives each version's batching settings. */
    registryAddress: e.BATCHER_REGISTRY_ADDRESS,
    /**
     * Until the watch holds a model: how long a version's settings read from the registry are used
     * before it is asked again (the last ones stay while it is down).
     */
    settingsTtlMs: e.BATCHER_SETTINGS_TTL_MS,
    /** Batches in flight on one worker at most: one computing, the next one ready behind it. */
    maxBatchesPerWorker: e.BATCHER_MAX_BATCHES_PER_WORKER,
    /** How the worker for a batch is picked among those with room: least outstanding, or power of two choices. */
    replicaChoice: e.BATCHER_REPLICA_CHOICE,
    /** What a version's Batching leaves unset. */
    defaults: {
      maxQueueDelayUs: e.BATCHER_DEFAULT_MAX_QUEUE_DELAY_US,
      maxQueueSize: e.BATCHER_DEFAULT_MAX_QUEUE_SIZE,
    },
  };
}

export type BatcherConfig = ReturnType<typeof loadBatcherConfig>;
export const BATCHER_CONFIG = Symbol('BATCHER_CONFIG');
