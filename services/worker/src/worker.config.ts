import { address, byteSize, ConfigError, type Env, parseEnv, positiveInt } from '@infermesh/config';
import { runtimeSettings, runtimeShape } from '@infermesh/runtime';
import { availableParallelism, hostname, totalmem } from 'node:os';
import { resolve } from 'node:path';
import { z } from 'zod';

/** A comma-separated list of names, each matching `pattern`. */
const nameList = (pattern: RegExp, message: string, fallback = '') =>
  z
    .string()
    .default(fallback)
    .transform((value) =>
      value
        .split(',')
        .map((p) => p.trim())
        .filter((p) => p.length > 0),
    )
    .pipe(z.array(z.string().regex(pattern, message)));

const shape = {
  ...runtimeShape('WORKER', { grpc: 50055, metrics: 9105 }),
  WORKER_REGISTRY_ADDRESS: address('127.0.0.1:50051'),
  WORKER_ID: z.string().regex(/^\S+$/, 'expected an id without spaces').optional(),
  WORKER_EXECUTION_PROVIDERS: nameList(
    /^[a-z0-9_-]+$/,
    'expected execution provider names such as cuda,cpu',
    'cuda,cpu',
  )
    .transform((names) => names.map((n) => n.toLowerCase()))
    .pipe(z.array(z.string()).min(1, 'name at least one execution provider')),
  WORKER_ARTIFACT_DIR: z.string().min(1).default('.infermesh/worker-artifacts'),
  WORKER_ARTIFACT_CACHE_BYTES: byteSize('10GiB'),
  WORKER_SYNC_INTERVAL_MS: positiveInt(5_000),
  WORKER_INSTANCES_PER_MODEL: positiveInt(1),
  WORKER_EXECUTION_THREADS: z.coerce.number().int().positive().optional(),
  WORKER_INTRA_OP_THREADS: z.coerce.number().int().positive().optional(),
  WORKER_COMPUTE_NICE: z.coerce.number().int().min(0, 'expected 0 to 19').max(19, 'expected 0 to 19').default(10),
  WORKER_MEMORY_BUDGET_BYTES: byteSize(Math.floor(totalmem() / 2)),
  WORKER_PINNED_MODELS: nameList(/^[^\s,/]+$/, 'expected model names separated by commas'),
  WORKER_MODELS: nameList(/^[^\s,/]+$/, 'expected model names separated by commas'),
  WORKER_LOAD_TIMEOUT_MS: positiveInt(120_000),
  WORKER_WARMUP_BATCH_SIZES: nameList(/^(max|[1-9]\d*)$/, 'expected batch sizes such as 1,max', '1,max'),
  WORKER_GPU_METRICS_INTERVAL_MS: positiveInt(5_000),
};

/** The worker's configuration, validated once at start-up. */
export function loadWorkerConfig(env: Env) {
  const e = parseEnv(shape, env);
  const placed = new Set(e.WORKER_MODELS);
  const unplacedPins = e.WORKER_PINNED_MODELS.filter((m) => placed.size > 0 && !placed.has(m));
  if (unplacedPins.length > 0) {
    throw new ConfigError([
      `WORKER_PINNED_MODELS: ${unplacedPins.map((m) => `"${m}"`).join(', ')} not in WORKER_MODELS, the models this worker serves (got ${JSON.stringify(e.WORKER_PINNED_MODELS.join(','))})`,
    ]);
  }
  const executionThreads = e.WORKER_EXECUTION_THREADS;
  if (executionThreads !== undefined && executionThreads < e.WORKER_INSTANCES_PER_MODEL) {
    throw new ConfigError([
      `WORKER_EXECUTION_THREADS: ${executionThreads} is fewer than WORKER_INSTANCES_PER_MODEL (${e.WORKER_INSTANCES_PER_MODEL}); each instance of a model needs a thread of its own`,
    ]);
  }
  return {
    runtime: runtimeSettings('WORKER', e),
    registryAddress: e.WORKER_REGISTRY_ADDRESS,
    /** Reported with every version state, so the registry knows which worker said what. */
    workerId: e.WORKER_ID ?? `${hostname()}-${process.pid}`,
    /** Tried in order for each model; the first that creates a session wins. */
    executionProviders: e.WORKER_EXECUTION_PROVIDERS,
    artifactDir: resolve(e.WORKER_ARTIFACT_DIR),
    /** Disk the local artifact copies may take; least recently used ones beyond it are deleted. */
    artifactCacheBytes: e.WORKER_ARTIFACT_CACHE_BYTES,
    /** How often the models are synced without a change from the registry watch (its backstop), and the registry listed while the watch is down. */
    syncIntervalMs: e.WORKER_SYNC_INTERVAL_MS,
    /** Execution instances per loaded model, each a session on a thread of its own (Triton's instance_group count). */
    instancesPerModel: e.WORKER_INSTANCES_PER_MODEL,
    /**
     * The most execution threads the worker runs; undefined: no limit, each instance of each model on a
     * thread of its own (a thread is a V8 isolate and a Node environment). Past the limit, models share
     * threads and run one at a time on each.
     */
    executionThreads,
    /** ONNX Runtime intra-op threads per instance; by default the cores shared out among a model's instances. */
    intraOpThreads: e.WORKER_INTRA_OP_THREADS ?? defaultIntraOpThreads(e.WORKER_INSTANCES_PER_MODEL),
    /**
     * How much lower than the rest of the process the execution threads (and the operator threads
     * onnxruntime starts from them) are scheduled, as a nice value: under load the main thread, which
     * takes requests, answers health checks and sends results, gets a core before the model's compute.
     */
    computeNice: e.WORKER_COMPUTE_NICE,
    /** What loaded models may be charged in all; idle unpinned ones are evicted to make room. */
    memoryBudgetBytes: e.WORKER_MEMORY_BUDGET_BYTES,
    /**
     * The models this worker serves (WORKER_MODELS; empty: every model). It never loads a version of
     * another, refuses requests for one, and reports no state of one to the registry.
     */
    placedModels: placed as ReadonlySet<string>,
    /** Models whose versions load at start-up and are never evicted; SERVING waits for them. */
    pinnedModels: new Set(e.WORKER_PINNED_MODELS),
    /** How long a request waits for its model to load on demand. */
    loadTimeoutMs: e.WORKER_LOAD_TIMEOUT_MS,
    /** Batch sizes warm-up runs before a version is READY; "max" is its maximum batch size. */
    warmupBatchSizes: e.WORKER_WARMUP_BATCH_SIZES.map((s) => (s === 'max' ? 'max' : Number(s))) as (number | 'max')[],
    /** How often nvidia-smi is asked for GPU utilisation and memory, where it is installed. */
    gpuMetricsIntervalMs: e.WORKER_GPU_METRICS_INTERVAL_MS,
    /** Time allowed for a registry call other than an artifact download. */
    registryTimeoutMs: 5_000,
    /** Time allowed for one artifact download. */
    downloadTimeoutMs: 10 * 60_000,
  };
}

/** As many intra-op threads as leaves instances × threads within the machine's cores, at least 1. */
export function defaultIntraOpThreads(instancesPerModel: number, cores = availableParallelism()): number {
  return Math.max(1, Math.floor(cores / instancesPerModel));
}

export type WorkerConfig = ReturnType<typeof loadWorkerConfig>;
export const WORKER_CONFIG = Symbol('WORKER_CONFIG');
