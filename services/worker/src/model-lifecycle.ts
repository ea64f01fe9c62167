import { Inject, Injectable } from '@nestjs/common';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError, Errors } from '@infermesh/grpc';
import { buildIntegerProbeModel, INTEGER_PROBE_DEPTH, INTEGER_PROBE_EXACT } from '@infermesh/model-builder';
import { DataType, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics, requestContext } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { link, mkdtemp, readdir, rm } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { ArtifactCache, ArtifactVerificationError } from './artifact-cache';
import { externalWeights } from './external-weights';
import { chooseEvictions, formatBytes } from './memory-budget';
import { ModelRegistry } from './model-registry';
import { ModelRuntime, type ModelSession } from './model-runtime';
import { ModelTable, type WorkerModel } from './model-table';
import { warmUpPlan } from '@infermesh/tensors';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** The name of the artifact's link in the directory a session reads its external weights from. */
const WEIGHTS_FILE = 'model.onnx';
/** The prefix of those directories, in the artifact cache's. */
const LOAD_DIR_PREFIX = '.load-';
const LOAD_BUCKETS_SECONDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/** Why a loaded version was unloaded, as the unloads counter labels it. */
export type UnloadReason = 'evicted' | 'requested' | 'retired' | 'shutdown';

/** A failure that retrying the same bytes will not fix: the version is FAILED on this worker. */
class LoadFailure extends Error {}

/**
 * Loads and unloads model versions within the worker's memory budget (the model lifecycle, apart
 * from the registry that says which versions exist):
 * - one load at a time, so that the process memory growth measured across it is that version's;
 * - one load per version however many requests wait for it;
 * - a load first makes room: idle unpinned versions are evicted least recently used first, and when
 *   that cannot free enough the load fails with RESOURCE_EXHAUSTED naming the budget;
 * - a version is READY only after warm-up has run it on every instance: the samples given at
 *   registration (a failure FAILS the version with the model's message), else synthetic inputs at its
 *   warm-up batch sizes (a failure leaves it READY but not warmed up, with the reason);
 * - the artifact is verified against the registry's SHA-256 and a mismatch is never loaded.
 */
@Injectable()
export class ModelLifecycle {
  private queue: Promise<unknown> = Promise.resolve();
  private prepared: Promise<void> | undefined;
  /** Whether onnxruntime's uint8 × int8 kernel saturates on this CPU: probed once, when first asked. */
  private integerProductsSaturate: Promise<boolean> | undefined;
  private stopped = false;
  private readonly abort = new AbortController();
  private readonly releases = new Set<Promise<void>>();
  /** Measured cost of each artifact loaded before, to make room for it up front next time. */
  private readonly measuredBytes = new Map<string, number>();
  private readonly loadSeconds: Histogram<'model' | 'outcome'>;
  private readonly loads: Counter<'outcome'>;
  private readonly unloads: Counter<'reason'>;
  private readonly evictions: Counter<'model'>;
  private readonly verificationFailures: Counter<'model'>;

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly registry: ModelRegistry,
    private readonly artifacts: ArtifactCache,
    private readonly runtime: ModelRuntime,
    private readonly table: ModelTable,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.loadSeconds = metrics.histogram(
      'model_load_duration_seconds',
      'Time to download, verify, load and warm up a model version, by outcome.',
      ['model', 'outcome'],
      LOAD_BUCKETS_SECONDS,
    );
    this.loads = metrics.counter(
      'model_loads_total',
      'Model version loads by outcome: ready, failed, no_room, interrupted.',
      ['outcome'],
    );
    this.unloads = metrics.counter(
      'model_unloads_total',
      'Model versions unloaded, by reason: evicted, requested, retired, shutdown.',
      ['reason'],
    );
    this.evictions = metrics.counter(
      'model_evictions_total',
      'Idle model versions evicted to make room for another under the memory budget.',
      ['model'],
    );
    this.verificationFailures = metrics.counter(
      'artifact_verification_failures_total',
      'Artifacts refused because their bytes did not match the SHA-256 the registry recorded.',
      ['model'],
    );
    metrics
      .gauge('memory_budget_bytes', 'The memory loaded model versions may be charged in all.')
      .set(config.memoryBudgetBytes);
  }

  /**
   * Loads the version unless it is READY; concurrent calls share one load. Rejects with an RpcError:
   * RESOURCE_EXHAUSTED when the budget has no room, UNAVAILABLE (MODEL_NOT_READY) when it failed.
   */
  ensureLoaded(entry: WorkerModel): Promise<void> {
    if (entry.retired) return Promise.reject(notReady(entry, 'is no longer served by this worker'));
    if (entry.state === ModelState.READY) return Promise.resolve();
    if (entry.state === ModelState.FAILED) return Promise.reject(notReady(entry, `failed to load: ${entry.reason}`));
    if (entry.loading === undefined) {
      // Shared by every request that waits for it, so it runs outside the request that started it:
      // that request's deadline or cancellation must not end the download for the others.
      const load = this.queue.then(() =>
        requestContext.run({ requestId: `load:${entry.name}` }, () => this.load(entry)),
      );
      this.queue = load.catch(() => undefined);
      entry.loading = load.finally(() => (entry.loading = undefined));
    }
    return entry.loading;
  }

  /** Unloads a loaded version once its requests in flight are done; it stays known, UNLOADED. */
  unload(entry: WorkerModel, reason: UnloadReason): Promise<void> {
    if (entry.session === undefined) return Promise.resolve();
    this.unloads.inc({ reason });
    this.logger.info('unloading model version', { name: entry.name, reason });
    const released = entry
      .unload(
        reason === 'evicted'
          ? `evicted to make room under the ${formatBytes(this.config.memoryBudgetBytes)} memory budget`
          : '',
      )
      .catch((error: unknown) =>
        this.logger.warn('releasing a session failed', { name: entry.name, err: message(error) }),
      )
      .finally(() => {
        this.releases.delete(released);
        this.table.changed();
      });
    this.releases.add(released);
    this.table.changed();
    return released;
  }

  /**
   * Forgets a version the registry no longer serves: new requests no longer find it, a load under way
   * is dropped, and its session is freed once the requests running on it are done.
   */
  retire(entry: WorkerModel): Promise<void> {
    entry.retired = true;
    if (this.table.get(entry.name) === entry) this.table.remove(entry.name);
    return this.unload(entry, 'retired');
  }

  /** Would the version fit without evicting anything, besides `plannedBytes` about to be loaded? */
  fitsWithoutEviction(entry: WorkerModel, plannedBytes = 0): boolean {
    return this.table.usedBytes + plannedBytes + this.estimateBytes(entry) <= this.config.memoryBudgetBytes;
  }

  /** Stops loading, unloads every version once its requests are done, and waits for the sessions to be freed. */
  async shutdown(): Promise<void> {
    this.stopped = true;
    this.abort.abort();
    await this.queue;
    for (const entry of this.table.list()) void this.unload(entry, 'shutdown');
    await Promise.all(this.releases);
  }

  /** What loading the version is expected to cost: its artifact, or what it measured when it last loaded. */
  estimateBytes(entry: WorkerModel): number {
    const artifact = entry.record.artifact;
    return Math.max(Number(artifact?.sizeBytes ?? 0n), this.measuredBytes.get(artifact?.sha256 ?? '') ?? 0);
  }

  private async load(entry: WorkerModel): Promise<void> {
    if (entry.retired) throw notReady(entry, 'is no longer served by this worker');
    if (entry.state === ModelState.READY) return;
    if (entry.state === ModelState.FAILED) throw notReady(entry, `failed to load: ${entry.reason}`);
    if (this.stopped) throw Errors.workerDraining('the worker is shutting down');
    const start = process.hrtime.bigint();
    const seconds = () => Number(process.hrtime.bigint() - start) / 1e9;
    entry.state = ModelState.LOADING;
    entry.reason = '';
    this.table.changed();
    const intraOpThreads = this.intraOpThreads(entry);
    this.logger.info('loading model version', {
      name: entry.name,
      sha256: entry.record.artifact?.sha256,
      pinned: entry.pinned,
      intra_op_threads: intraOpThreads,
    });
    if (entry.record.state === VersionState.REGISTERED) await this.report(entry, VersionState.LOADING, '');

    let session: ModelSession | undefined;
    let overflows = false;
    try {
      const bytes = await this.fetchArtifact(entry);
      await (this.prepared ??= this.runtime.prepare(this.config.executionProviders).catch((error: unknown) => {
        this.logger.warn('could not prepare the runtime; the first load is charged its start-up costs', {
          err: message(error),
        });
      }));
      overflows = await this.fullRangeWeightsOverflow(entry);
      await this.makeRoom(entry, Math.max(bytes.byteLength, this.estimateBytes(entry)));
      const memoryBefore = processMemory();
      try {
        session = await this.createSession(entry, bytes, intraOpThreads);
      } catch (error) {
        throw new LoadFailure(`could not create a session: ${message(error)}`);
      }
      const warmUpError = await this.warmUp(entry, session);
      if (entry.retired) throw notReady(entry, 'was retired while it loaded');
      const memoryBytes = Math.max(bytes.byteLength, modelGrowth(memoryBefore, processMemory()));
      this.measuredBytes.set(entry.record.artifact?.sha256 ?? '', memoryBytes);
      await this.makeRoom(entry, memoryBytes);
      if (this.stopped) throw Errors.workerDraining('the worker is shutting down');
      if (entry.retired) throw notReady(entry, 'was retired while it loaded');
      entry.ready(session, memoryBytes, warmUpError);
      session = undefined;
    } catch (error) {
      await session?.release();
      const outcome = this.failed(entry, error);
      this.loads.inc({ outcome });
      this.loadSeconds.observe({ model: entry.model, outcome }, seconds());
      this.table.changed();
      if (outcome === 'failed') await this.report(entry, VersionState.FAILED, entry.reason);
      throw error instanceof RpcError
        ? error
        : notReady(
            entry,
            (entry.state as ModelState) === ModelState.FAILED ? `failed to load: ${entry.reason}` : entry.reason,
          );
    }
    this.table.changed();
    this.loads.inc({ outcome: 'ready' });
    this.loadSeconds.observe({ model: entry.model, outcome: 'ready' }, seconds());
    this.logger.info('model version ready', {
      name: entry.name,
      execution_provider: entry.executionProvider,
      memory_bytes: entry.memoryBytes,
      load_ms: Math.round(seconds() * 1000),
      warmed: entry.warmUpError === '',
    });
    if (overflows && entry.executionProvider === 'cpu') {
      this.logger.warn(
        "the version has 8-bit weights, which this CPU's integer kernel overflows (x86 without VNNI): its answers here can be far less accurate than 7-bit weights would give; derive it again without --full-range",
        { name: entry.name, relative_l2_recorded: entry.record.lineage?.accuracy?.relativeL2 },
      );
    }
    // READY also when the version already is, from other workers: the registry keeps it READY while any worker has it.
    if (
      entry.record.state !== VersionState.READY ||
      !entry.record.readyWorkerIds.includes(this.config.workerId) ||
      entry.record.warmUpError !== entry.warmUpError
    ) {
      await this.report(entry, VersionState.READY, '', entry.warmUpError);
    }
  }

  /** Records why a load did not finish and returns its outcome label. */
  private failed(entry: WorkerModel, error: unknown): string {
    if (error instanceof LoadFailure) {
      entry.fail(error.message);
      this.logger.error('model version failed to load', { name: entry.name, reason: error.message });
      return 'failed';
    }
    entry.state = ModelState.UNLOADED;
    entry.reason = message(error);
    if (error instanceof RpcError && error.code === status.RESOURCE_EXHAUSTED) {
      this.logger.warn('no room to load model version', { name: entry.name, reason: entry.reason });
      return 'no_room';
    }
    if (entry.retired)
      this.logger.info('model version retired while it loaded; its session is freed', { name: entry.name });
    else if (!this.stopped) {
      this.logger.warn('model version load interrupted; the next sync loads it again', {
        name: entry.name,
        err: entry.reason,
      });
      // No reason kept: a version that is still to serve loads again at the next sync (the registry
      // was unreachable, or the worker was shutting down), not only when a request asks for it.
      entry.reason = '';
    }
    return 'interrupted';
  }

  /**
   * Makes room for `bytes` more (besides what `entry` is charged): evicts idle unpinned versions
   * least recently used first and waits for their sessions to be freed, or throws RESOURCE_EXHAUSTED.
   */
  private async makeRoom(entry: WorkerModel, bytes: number): Promise<void> {
    const budget = this.config.memoryBudgetBytes;
    const candidates = this.table.list().filter((e) => e !== entry && e.idle && !e.pinned);
    const victims = chooseEvictions(candidates, this.table.usedBytes - entry.memoryBytes, bytes, budget);
    if (victims === undefined) {
      const held = this.table.list().filter((e) => e !== entry && e.memoryBytes > 0);
      throw Errors.memoryBudgetExceeded(
        `version ${entry.version} of model "${entry.model}" needs ${formatBytes(bytes)} but the worker's memory budget ` +
          `(WORKER_MEMORY_BUDGET_BYTES) is ${formatBytes(budget)}, of which ${formatBytes(this.table.usedBytes)} is held by ` +
          `${held.length} loaded version(s) that are pinned or in use`,
        { metadata: { model: entry.model, version: entry.version, budget_bytes: String(budget) } },
      );
    }
    const freed: Promise<void>[] = [];
    for (const victim of victims) {
      const victimEntry = this.table.get(victim.name);
      if (victimEntry === undefined) continue;
      this.evictions.inc({ model: victimEntry.model });
      this.logger.info('evicting model version', {
        name: victim.name,
        for: entry.name,
        memory_bytes: victim.memoryBytes,
      });
      freed.push(this.unload(victimEntry, 'evicted'));
    }
    await Promise.all(freed);
  }

  /**
   * Whether `entry` is an int8 variant with full-range (8-bit) weights (derived with --full-range)
   * and this CPU's uint8 × int8 kernel adds pairs of products in 16 bits (x86 without VNNI): they
   * overflow it (the demo MLP's relative L2 error goes from 1.5 % with 7-bit weights to 9 to 17 %), and
   * the registry's figures may have been measured on a CPU they do not overflow. Asked before the
   * load, so that the probe is not charged to the version; the load warns once its session runs on
   * the CPU, and still serves: the operator decides.
   */
  private async fullRangeWeightsOverflow(entry: WorkerModel): Promise<boolean> {
    if (entry.record.lineage?.settings?.reduceRange !== false) return false;
    return (this.integerProductsSaturate ??= this.probeIntegerProducts());
  }

  /** Runs the integer probe (buildIntegerProbeModel) once; true when its answer is not exact. */
  private async probeIntegerProducts(): Promise<boolean> {
    try {
      const session = await this.runtime.load(buildIntegerProbeModel().bytes, ['cpu']);
      try {
        const a = create(TensorSchema, {
          name: 'a',
          datatype: DataType.UINT8,
          shape: [1n, BigInt(INTEGER_PROBE_DEPTH)],
          data: new Uint8Array(INTEGER_PROBE_DEPTH).fill(255),
        });
        const y = (await session.run([a], ['y'])).outputs[0]!.data;
        return new DataView(y.buffer, y.byteOffset, y.byteLength).getInt32(0, true) !== INTEGER_PROBE_EXACT;
      } finally {
        await session.release();
      }
    } catch (error) {
      this.logger.warn('could not probe the integer kernel of this CPU', { err: message(error) });
      return false;
    }
  }

  /**
   * Runs the version's warm-up on every instance and returns '' once it has. The samples given at
   * registration are what a client sends (the version's input normalization applies) and a failure
   * is a LoadFailure carrying the model's message. Without them, synthetic inputs may not suit the
   * model (a minimum length, values in a set): the model refusing them (INVALID_ARGUMENT) leaves the
   * version to serve without warm-up, and the reason is returned; any other failure is a LoadFailure.
   */
  private async warmUp(entry: WorkerModel, session: ModelSession): Promise<string> {
    const plan = warmUpPlan(entry.record.warmUp, session.inputs, entry.maxBatchSize, this.config.warmupBatchSizes);
    for (const run of plan.runs) {
      try {
        const inputs = plan.given ? entry.processing.preprocess(run.inputs()) : run.inputs();
        await Promise.all(Array.from({ length: Math.max(1, session.instanceCount) }, () => session.run(inputs, [])));
      } catch (error) {
        const reason = `${run.label} failed on ${session.executionProvider}: ${message(error)}`;
        // Only the model refusing made-up values is forgiven; a datatype it cannot hold, or an instance that dies, is not.
        const refused = error instanceof RpcError && error.code === status.INVALID_ARGUMENT;
        if (plan.given || !refused) throw new LoadFailure(reason);
        this.logger.warn('synthetic warm-up failed; the version serves without warm-up', { name: entry.name, reason });
        return `${reason} (give warm-up samples at registration: infermesh models register --warmup)`;
      }
    }
    return '';
  }

  /** Removes, once, the load directories a worker that stopped mid-load left (see createSession). */
  private staleLoadDirs: Promise<void> | undefined;

  /**
   * The version's session, `intraOpThreads` operator threads to each instance. Its large weights are
   * read from the artifact cache's verified copy of `bytes` as external data, which the runtime maps,
   * packs and lets go, rather than from `bytes`, which it copies twice first (external-weights.ts). The session is told of a directory of its own
   * that holds only a hard link to that copy: the runtime refuses external paths that leave it, so a
   * model can read no file but its own. From `bytes` when the model has no large weight or the copy
   * cannot serve (deleted meanwhile to make room: the load is not lost). The runtime lets go of the
   * bytes once the session runs, and reads them again (verified) from the artifact cache, or the
   * registry, only to replace an execution thread that died (from the bytes, then).
   */
  private async createSession(entry: WorkerModel, bytes: Buffer, intraOpThreads: number): Promise<ModelSession> {
    const providers = this.config.executionProviders;
    const reload = () => this.fetchArtifact(entry);
    const external = externalWeights(bytes, WEIGHTS_FILE);
    if (external !== undefined) {
      let dir: string | undefined;
      try {
        // Those a worker that stopped mid-load left (their links would keep evicted copies on disk)
        // go before this process makes any.
        await (this.staleLoadDirs ??= removeLoadDirs(this.artifacts.dir));
        dir = await mkdtemp(join(this.artifacts.dir, LOAD_DIR_PREFIX));
        await link(this.artifacts.pathOf(entry.record.artifact?.sha256 ?? ''), join(dir, WEIGHTS_FILE));
        return await this.runtime.load(external, providers, reload, { weightsDir: dir, intraOpThreads });
      } catch (error) {
        this.logger.warn('could not read the weights from the artifact cache; loading the model from its bytes', {
          name: entry.name,
          err: message(error),
        });
      } finally {
        if (dir !== undefined) await rm(dir, { recursive: true, force: true });
      }
    }
    return this.runtime.load(bytes, providers, reload, { intraOpThreads });
  }

  /**
   * The operator threads of each of the version's instances: its own (at most this machine's cores:
   * more would only take turns on them), else the worker's.
   */
  private intraOpThreads(entry: WorkerModel): number {
    const asked = entry.record.execution?.intraOpThreads ?? 0;
    return asked === 0 ? this.config.intraOpThreads : Math.min(asked, availableParallelism());
  }

  /** The version's verified artifact; a mismatch or an artifact the registry lacks is a LoadFailure. */
  private async fetchArtifact(entry: WorkerModel): Promise<Buffer> {
    const sha256 = entry.record.artifact?.sha256 ?? '';
    if (sha256 === '') throw new LoadFailure('the registry records no artifact for this version');
    try {
      return await this.artifacts.fetch(sha256, () => this.registry.download(sha256, this.abort.signal));
    } catch (error) {
      if (error instanceof ArtifactVerificationError) {
        this.verificationFailures.inc({ model: entry.model });
        throw new LoadFailure(`artifact refused: ${error.message}`);
      }
      if (error instanceof RpcError && error.code === status.NOT_FOUND) {
        throw new LoadFailure(`artifact ${sha256} is not in the registry: ${error.message}`);
      }
      throw Errors.modelNotReady(`could not download the artifact of ${entry.name}: ${message(error)}`, {
        metadata: { model: entry.model, version: entry.version },
      });
    }
  }

  private async report(entry: WorkerModel, state: VersionState, reason: string, warmUpError = ''): Promise<void> {
    if (this.stopped) return;
    try {
      await this.registry.reportState(entry.name, state, reason, warmUpError);
      entry.record.state = state;
      if (state === VersionState.READY) entry.record.warmUpError = warmUpError;
      if (state === VersionState.READY && !entry.record.readyWorkerIds.includes(this.config.workerId))
        entry.record.readyWorkerIds.push(this.config.workerId);
    } catch (error) {
      this.logger.warn('could not report a version state; will report again', {
        name: entry.name,
        state: VersionState[state],
        err: message(error),
      });
    }
  }
}

function notReady(entry: WorkerModel, detail: string): RpcError {
  return Errors.modelNotReady(`version ${entry.version} of model "${entry.model}" ${detail}`, {
    metadata: { model: entry.model, version: entry.version },
  });
}

export function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function removeLoadDirs(dir: string): Promise<void> {
  const names = await readdir(dir).catch(() => [] as string[]);
  await Promise.all(
    names.filter((n) => n.startsWith(LOAD_DIR_PREFIX)).map((n) => rm(join(dir, n), { recursive: true, force: true })),
  );
}

interface ProcessMemory {
  /** Resident memory. */
  resident: number;
  /** What the service's JavaScript holds of it: the main thread's heap and array buffers. */
  js: number;
}

function processMemory(): ProcessMemory {
  const { rss, heapTotal, arrayBuffers } = process.memoryUsage();
  return { resident: rss, js: heapTotal + arrayBuffers };
}

/**
 * What a load grew the process by, less what its JavaScript grew by: what the load leaves for the
 * garbage collector (its warm-up's tensors: 0.5 MiB for the demo MLP, 14 MiB for the generated CNN
 * at batch 64), and what other calls allocate meanwhile, is not the model's to carry while it stays
 * loaded. Only growth is taken off: JavaScript memory collected meanwhile mostly stays with the C
 * library, resident, and the process does not shrink for it.
 */
function modelGrowth(before: ProcessMemory, after: ProcessMemory): number {
  return after.resident - before.resident - Math.max(0, after.js - before.js);
}
