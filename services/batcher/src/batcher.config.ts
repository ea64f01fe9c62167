import { addressList, type Env, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';

const shape = {
  ...runtimeShape('BATCHER', { grpc: 50054, metrics: 9104 }),
  BATCHER_WORKER_ADDRESSES: addressList('127.0.0.1:50055'),
  BATCHER_WORKER_POLL_MS: positiveInt(1_000),
  BATCHER_WORKER_TIMEOUT_MS: positiveInt(2_000),
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
  };
}

export type BatcherConfig = ReturnType<typeof loadBatcherConfig>;
export const BATCHER_CONFIG = Symbol('BATCHER_CONFIG');
