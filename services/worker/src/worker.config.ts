import { address, type Env, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { z } from 'zod';

const shape = {
  ...runtimeShape('WORKER', { grpc: 50055, metrics: 9105 }),
  WORKER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  WORKER_ID: z.string().regex(/^\S+$/, 'expected an id without spaces').optional(),
  WORKER_EXECUTION_PROVIDERS: z
    .string()
    .default('cuda,cpu')
    .transform((value) => value.split(',').map((p) => p.trim().toLowerCase()).filter((p) => p.length > 0))
    .pipe(z.array(z.string().regex(/^[a-z0-9_-]+$/, 'expected execution provider names such as cuda,cpu')).min(1, 'name at least one execution provider')),
  WORKER_ARTIFACT_DIR: z.string().min(1).default('.infermesh/worker-artifacts'),
  WORKER_SYNC_INTERVAL_MS: positiveInt(1000),
  WORKER_INTRA_OP_THREADS: positiveInt(1),
};

/** The worker's configuration, validated once at start-up. */
export function loadWorkerConfig(env: Env) {
  const e = parseEnv(shape, env);
  return {
    runtime: runtimeSettings('WORKER', e),
    registryAddress: e.WORKER_REGISTRY_ADDRESS,
    /** Reported with every version state, so the registry knows which worker said what. */
    workerId: e.WORKER_ID ?? `${hostname()}-${process.pid}`,
    /** Tried in order for each model; the first that creates a session wins. */
    executionProviders: e.WORKER_EXECUTION_PROVIDERS,
    artifactDir: resolve(e.WORKER_ARTIFACT_DIR),
    syncIntervalMs: e.WORKER_SYNC_INTERVAL_MS,
    intraOpThreads: e.WORKER_INTRA_OP_THREADS,
    /** Time allowed for a registry call other than an artifact download. */
    registryTimeoutMs: 5_000,
    /** Time allowed for one artifact download. */
    downloadTimeoutMs: 10 * 60_000,
  };
}

export type WorkerConfig = ReturnType<typeof loadWorkerConfig>;
export const WORKER_CONFIG = Symbol('WORKER_CONFIG');
