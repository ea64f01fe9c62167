import { address, addressList, type Env, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { z } from 'zod';

const shape = {
  ...runtimeShape('BATCHER', { grpc: 50054, metrics: 9104 }),
  BATCHER_WORKER_ADDRESSES: addressList('127.0.0.1:50055'),
  BATCHER_WORKER_POLL_MS: positiveInt(1_000),
  BATCHER_WORKER_TIMEOUT_MS: positiveInt(2_000),
  BATCHER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  BATCHER_SETTINGS_TTL_MS: positiveInt(5_000),
  BATCHER_MAX_BATCHES_PER_WORKER: positiveInt(2),
  BATCHER_DEFAULT_MAX_QUEUE_DELAY_US: z.coerce.number().int().nonnegative().max(10_000_000).default(1_000),
  BATCHER_DEFAULT_MAX_QUEUE_SIZE: positiveInt(1_000),
};

/** The batcher's configuration, validated once at start-up. */
export function loadBatcherConfig(env: Env) {
  const e = parseEnv(shape, env);
  return {
    runtime: runtimeSettings('BATCHER', e),
    /** The workers this batcher dispatches to. */
    workerAddresses: e.BATCHER_WORKER_ADDRESSES,
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
    /** What a version's Batching leaves unset. */
    defaults: {
      maxQueueDelayUs: e.BATCHER_DEFAULT_MAX_QUEUE_DELAY_US,
      maxQueueSize: e.BATCHER_DEFAULT_MAX_QUEUE_SIZE,
    },
  };
}

export type BatcherConfig = ReturnType<typeof loadBatcherConfig>;
export const BATCHER_CONFIG = Symbol('BATCHER_CONFIG');
