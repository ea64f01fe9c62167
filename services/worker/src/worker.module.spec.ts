import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import {
  buildMlpModel,
  buildPaddedModel,
  buildReflectPadModel,
  buildSampleRateModel,
  buildTinyModel,
  encodeModel,
  INTEGER_PROBE_EXACT,
  node,
} from '@infermesh/model-builder';
import { Health, HealthCheckResponse_ServingStatus } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type ExecutionSchema,
  type LineageSchema,
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  VersionState,
  type WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { bootstrap } from '@infermesh/runtime';
import { DataType } from '@infermesh/tensors';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually, FakeRegistry, freePort, integerProbeAnswer, rpcRejection } from '@infermesh/testing';
import { createHash } from 'node:crypto';
import * as ort from 'onnxruntime-node';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { InferenceExecutor } from './inference-executor';
import { ModelRegistry } from './model-registry';
import { ModelLoadError, ModelRuntime } from './model-runtime';
import { ModelSync } from './model-sync';
import { loadWorkerConfig } from './worker.config';
import { workerBinding } from './worker.grpc';
import { WorkerModule } from './worker.module';

const MiB = 2 ** 20;

/**
 * The registry as the worker sees it, in memory: the registry is another service (its own specs and
 * the e2e suites run it for real); here the worker must meet versions, artifacts and failures that
 * would be hard to arrange through it, such as an artifact whose bytes do not match their record.
 */
class InMemoryRegistry extends ModelRegistry {
  readonly versions = new Map<string, ModelVersion>();
  /** Model settings by model id; a model not named here is neither pinned nor unloaded. */
  readonly settings = new Map<string, { pinned?: boolean; unloaded?: boolean }>();
  readonly artifacts = new Map<string, Uint8Array>();
  readonly reports: { name: string; state: VersionState; reason: string; warmUpError: string }[] = [];
  downloads = 0;
  /** ListModels calls: one per sync while the watch is not connected. */
  lists = 0;
  /** Serves WatchModels, told of each change to a model. */
  private readonly watched = new FakeRegistry();

  add(
    model: string,
    bytes: Uint8Array,
    options: {
      maxBatchSize?: number;
      serve?: Uint8Array;
      version?: string;
      warmUp?: MessageInitShape<typeof WarmUpSchema>;
      execution?: MessageInitShape<typeof ExecutionSchema>;
      lineage?: MessageInitShape<typeof LineageSchema>;
    } = {},
  ): string {
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    const name = `models/${model}/versions/${options.version ?? '1'}`;
    this.artifacts.set(sha256, options.serve ?? bytes);
    this.versions.set(
      name,
      create(ModelVersionSchema, {
        name,
        state: VersionState.REGISTERED,
        artifact: { sha256, sizeBytes: BigInt(bytes.byteLength), format: 'onnx' },
        signature: { maxBatchSize: options.maxBatchSize ?? 8 },
        ...(options.warmUp !== undefined && { warmUp: options.warmUp }),
        ...(options.execution !== undefined && { execution: options.execution }),
        ...(options.lineage !== undefined && { lineage: options.lineage }),
      }),
    );
    this.changed(model);
    return name;
  }

  /** Changes a version's state or a model's settings as the registry would, and tells the watch. */
  change(
    model: string,
    update: { state?: VersionState; version?: string; pinned?: boolean; unloaded?: boolean },
  ): void {
    if (update.state !== undefined)
      this.versions.get(`models/${model}/versions/${update.version ?? '1'}`)!.state = update.state;
    const settings = this.settings.get(model) ?? {};
    if (update.pinned !== undefined) settings.pinned = update.pinned;
    if (update.unloaded !== undefined) settings.unloaded = update.unloaded;
    this.settings.set(model, settings);
    this.changed(model);
  }

  async listModels(): Promise<Model[]> {
    this.lists += 1;
    const ids = new Set([...this.versions.keys()].map((name) => name.split('/')[1]!));
    return [...ids].map((id) => this.model(id));
  }

  /**
   * Serves WatchModels as its contract says, over a real socket: a snapshot first (or an empty
   * message when the follower's revision is current), then one message per change.
   */
  async serveWatch(): Promise<this> {
    await this.watched.start();
    return this;
  }

  get watchAddress(): string {
    return this.watched.address;
  }

  /** The revision of the last change. */
  get currentRevision(): bigint {
    return this.watched.revision;
  }

  async stopWatch(): Promise<void> {
    await this.watched.stop();
  }

  private model(id: string): Model {
    const versions = [...this.versions.values()]
      .filter((v) => v.name.startsWith(`models/${id}/`))
      .map((v) => create(ModelVersionSchema, v));
    return create(ModelSchema, {
      name: `models/${id}`,
      versions,
      revision: this.watched.revision,
      ...this.settings.get(id),
    });
  }

  private changed(model: string): void {
    this.watched.put(this.model(model));
  }

  /** While set, downloads wait for it. */
  hold: Promise<void> | undefined;
  /** Downloads to refuse as an unreachable registry does, before serving them again. */
  refuseDownloads = 0;

  async *download(sha256: string): AsyncIterable<Uint8Array> {
    this.downloads += 1;
    await this.hold;
    if (this.refuseDownloads > 0) {
      this.refuseDownloads -= 1;
      throw new Error('No connection established. Last error: connect ECONNREFUSED');
    }
    const bytes = this.artifacts.get(sha256);
    if (bytes === undefined) throw new Error(`no artifact ${sha256}`);
    for (let offset = 0; offset < bytes.byteLength; offset += MiB) yield bytes.subarray(offset, offset + MiB);
  }

  async reportState(name: string, state: VersionState, reason: string, warmUpError = ''): Promise<void> {
    this.reports.push({ name, state, reason, warmUpError });
    const version = this.versions.get(name);
    if (version !== undefined) {
      version.state = state;
      if (state === VersionState.READY) version.warmUpError = warmUpError;
    }
    this.changed(name.split('/')[1]!);
  }

  close(): void {}
}

const input = (rows: number): Tensor =>
  create(TensorSchema, {
    name: 'input',
    datatype: DataType.FP32,
    shape: [BigInt(rows), 4n],
    data: new Uint8Array(rows * 16),
  });
const request = (model: string, rows = 1) => ({
  request: { modelName: model, modelVersion: '1', id: model, inputs: [input(rows)] },
});

/** Starts the worker with `registry` in place of the registry; its watch follows WORKER_REGISTRY_ADDRESS, by default an address nothing listens on. */
async function startWorker(registry: InMemoryRegistry, env: Record<string, string>) {
  const dir = mkdtempSync(join(tmpdir(), 'worker-'));
  const config = loadWorkerConfig({
    WORKER_REGISTRY_ADDRESS: `127.0.0.1:${await freePort()}`,
    WORKER_GRPC_PORT: '0',
    WORKER_METRICS_PORT: '0',
    WORKER_LOG_LEVEL: process.env['DEBUG_WORKER'] === undefined ? 'error' : 'info',
    WORKER_ID: 'worker-under-test',
    WORKER_ARTIFACT_DIR: dir,
    WORKER_SYNC_INTERVAL_MS: '50',
    WORKER_EXECUTION_PROVIDERS: 'cpu',
    WORKER_INTRA_OP_THREADS: '1',
    ...env,
  });
  const module = WorkerModule.forRoot(config);
  module.providers = module.providers!.map((p) =>
    'provide' in p && p.provide === ModelRegistry ? { provide: ModelRegistry, useValue: registry } : p,
  );
  const running = await bootstrap({
    module,
    grpc: (app) => [workerBinding(app)],
    onListening: (app) => app.get(ModelSync).pinnedReady(),
    beforeShutdown: (app) => app.get(InferenceExecutor).drain(),
  });
  const address = `127.0.0.1:${running.grpcPort}`;
  const client = createClient(WorkerService, address);
  const health = createClient(Health, address);
  return {
    running,
    client,
    health,
    metrics: () => running.app.get(Metrics).render(),
    stop: async () => {
      client.close();
      health.close();
      await running.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

type Worker = Awaited<ReturnType<typeof startWorker>>;

/** Loads take a while: conditions get 20 s. */
const until = (check: () => Promise<boolean>) => eventually(check, 20_000, 25);

const states = async (client: ServiceClient<typeof WorkerService>): Promise<Record<string, string>> =>
  Object.fromEntries((await client.listModels({})).models.map((m) => [m.name.split('/')[1]!, ModelState[m.state]]));

function metric(text: string, name: string): number {
  const escaped = name.replace(/[{}"=]/g, (c) => `\\${c}`);
  const match = new RegExp(`^infermesh_worker_${escaped} (\\S+)$`, 'm').exec(text);
  return match === null ? 0 : Number(match[1]);
}

describe(WorkerModule.name, () => {
  let worker: Worker | undefined;
  afterEach(async () => {
    await worker?.stop();
    worker = undefined;
  });

  it('serves three models under a budget that fits two, evicting the least recently used, with no failed request', async () => {
    const registry = new InMemoryRegistry();
    for (const seed of [1, 2, 3]) registry.add(`m${seed}`, buildPaddedModel(48 * MiB, seed).bytes);
    worker = await startWorker(registry, { WORKER_MEMORY_BUDGET_BYTES: '120MiB' });
    const { client } = worker;
    // Each version is loaded once to validate it, evicting as it goes: all three are READY in the registry.
    await until(async () => [...registry.versions.values()].every((v) => v.state === VersionState.READY));
    expect(Object.values(await states(client)).filter((s) => s === 'READY')).toHaveLength(2);

    for (let round = 0; round < 3; round++) {
      for (const model of ['m1', 'm2', 'm3']) {
        const { response } = await client.infer(request(model, 2));
        expect(response?.outputs[0]?.shape).toEqual([2n, 3n]);
        const listed = await client.listModels({});
        expect(listed.models.filter((m) => m.state === ModelState.READY).length).toBeLessThanOrEqual(2);
        expect(Number(listed.memoryUsedBytes)).toBeLessThanOrEqual(120 * MiB);
        const served = listed.models.find((m) => m.name === `models/${model}/versions/1`)!;
        expect(served.state).toBe(ModelState.READY);
        // Charged at least its artifact's size.
        expect(served.memoryBytes).toBeGreaterThanOrEqual(registry.versions.get(served.name)!.artifact!.sizeBytes);
      }
    }
    // Concurrent requests for an evicted model share one load.
    const evicted = Object.entries(await states(client)).find(([, s]) => s === 'UNLOADED')![0];
    const loadsBefore = metric(await worker.metrics(), 'model_loads_total{outcome="ready"}');
    const answers = await Promise.all(Array.from({ length: 5 }, () => client.infer(request(evicted))));
    expect(answers.every((a) => a.response?.modelName === evicted)).toBe(true);
    const text = await worker.metrics();
    expect(metric(text, 'model_loads_total{outcome="ready"}')).toBe(loadsBefore + 1);
    expect(
      metric(text, 'model_evictions_total{model="m1"}') +
        metric(text, 'model_evictions_total{model="m2"}') +
        metric(text, 'model_evictions_total{model="m3"}'),
    ).toBeGreaterThanOrEqual(9);
    expect(metric(text, 'inference_failures_total{reason="MEMORY_BUDGET_EXCEEDED"}')).toBe(0);
    expect(metric(text, 'models_loaded{device="cpu"}')).toBe(2);
    expect(metric(text, 'models_loaded_bytes{device="cpu"}')).toBe(
      Number((await client.listModels({})).memoryUsedBytes),
    );
    expect(metric(text, 'memory_budget_bytes')).toBe(120 * MiB);
    expect(text).toMatch(
      /infermesh_worker_inference_compute_seconds_count\{model="m1",version="1",device="cpu"\} [1-9]/,
    );
  }, 90_000);

  it('loads again, at the next sync, a version whose artifact the registry could not serve for a while', async () => {
    const registry = new InMemoryRegistry();
    registry.add('tiny', buildTinyModel().bytes);
    registry.refuseDownloads = 2;
    worker = await startWorker(registry, {});

    await until(async () => registry.versions.get('models/tiny/versions/1')?.state === VersionState.READY);
    expect(registry.downloads).toBe(3);
    expect(metric(await worker.metrics(), 'model_loads_total{outcome="interrupted"}')).toBe(2);
  });

  it('refuses a load that cannot fit beside pinned models with RESOURCE_EXHAUSTED naming the budget, and says SERVING once they are READY', async () => {
    const registry = new InMemoryRegistry();
    registry.add('pinned', buildPaddedModel(64 * MiB, 1).bytes);
    registry.versions.get('models/pinned/versions/1')!.state = VersionState.READY;
    registry.add('big', buildPaddedModel(64 * MiB, 2).bytes);
    registry.versions.get('models/big/versions/1')!.state = VersionState.READY;
    worker = await startWorker(registry, { WORKER_MEMORY_BUDGET_BYTES: '100MiB', WORKER_PINNED_MODELS: 'pinned' });
    // bootstrap resolved: SERVING, so the pinned model must be READY already.
    expect((await worker.health.check({ service: '' })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect(await states(worker.client)).toEqual({ pinned: 'READY', big: 'UNLOADED' });
    const error = await rpcRejection(worker.client.infer(request('big')));
    expect([error.code, error.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'MEMORY_BUDGET_EXCEEDED']);
    expect(error.message).toMatch(
      /needs 64\.0 MiB but the worker's memory budget \(WORKER_MEMORY_BUDGET_BYTES\) is 100\.0 MiB/,
    );
    // Unpinning and unloading the pinned model makes the room.
    await worker.client.unloadModel({ name: 'models/pinned/versions/1' });
    expect((await worker.client.infer(request('big'))).response?.modelName).toBe('big');
    const { model } = await worker.client.loadModel({ name: 'models/pinned/versions/1', pin: true });
    expect(model).toMatchObject({ state: ModelState.READY, pinned: true, instances: 1 });
    expect(await states(worker.client)).toEqual({ pinned: 'READY', big: 'UNLOADED' });
  });

  it("loads a version with the operator threads it asks for, at most the machine's cores, else with WORKER_INTRA_OP_THREADS", async () => {
    const registry = new InMemoryRegistry();
    worker = await startWorker(registry, { WORKER_INTRA_OP_THREADS: '1' });
    const loads = jest.spyOn(worker.running.app.get(ModelRuntime), 'load');
    const threadsOfLoad = async (model: string, execution?: MessageInitShape<typeof ExecutionSchema>) => {
      const name = registry.add(model, buildTinyModel().bytes, { ...(execution !== undefined && { execution }) });
      await until(async () => registry.versions.get(name)?.state === VersionState.READY);
      return loads.mock.calls.at(-1)![3]?.intraOpThreads;
    };
    expect(await threadsOfLoad('own')).toBe(1);
    expect(await threadsOfLoad('two', { intraOpThreads: 2 })).toBe(Math.min(2, availableParallelism()));
    expect(await threadsOfLoad('many', { intraOpThreads: 256 })).toBe(availableParallelism());
    expect(loads).toHaveBeenCalledTimes(3);
    expect((await worker.client.infer(request('many'))).response?.outputs[0]?.shape).toEqual([1n, 3n]);
  });

  it("does not charge a version what the service's JavaScript allocates while it loads", async () => {
    const registry = new InMemoryRegistry();
    worker = await startWorker(registry, {});
    const runtime = worker.running.app.get(ModelRuntime);
    const load = runtime.load.bind(runtime);
    // 64 MiB of array buffers and a million objects on the heap, written to (so resident), allocated
    // while the session starts and held until the version is READY: the load's garbage, or other calls'.
    const held: unknown[] = [];
    jest.spyOn(runtime, 'load').mockImplementation(async (...args) => {
      const session = await load(...args);
      held.push(
        new Uint8Array(64 * MiB).fill(1),
        Array.from({ length: 1 << 20 }, (_, i) => ({ i })),
      );
      return session;
    });
    const name = registry.add('tiny', buildTinyModel().bytes);
    await until(async () => registry.versions.get(name)?.state === VersionState.READY);
    expect(held).toHaveLength(2);
    const { models } = await worker.client.listModels({});
    // What an execution instance of a tiny model costs is well under 16 MiB; the held bytes are not in it.
    expect(Number(models.find((m) => m.name === name)!.memoryBytes)).toBeLessThan(16 * MiB);
  });

  it('warns when a version with 8-bit weights loads on a CPU whose integer kernel they overflow, and serves it', async () => {
    // What onnxruntime computes on this CPU, asked directly: the warning follows it.
    const saturates = (await integerProbeAnswer()) !== INTEGER_PROBE_EXACT;
    const registry = new InMemoryRegistry();
    worker = await startWorker(registry, {});
    const warn = jest.spyOn(worker.running.app.get(JsonLogger), 'warn');
    registry.add('full', buildTinyModel().bytes, {
      lineage: { settings: { reduceRange: false }, accuracy: { relativeL2: 0.01 } },
    });
    registry.add('reduced', buildTinyModel().bytes, { lineage: { settings: { reduceRange: true } } });
    registry.add('plain', buildTinyModel().bytes);

    await until(async () => [...registry.versions.values()].every((v) => v.state === VersionState.READY));
    const warned = warn.mock.calls.filter(([text]) => String(text).includes('8-bit weights'));
    expect(warned.map(([, fields]) => fields)).toEqual(
      saturates ? [{ name: 'models/full/versions/1', relative_l2_recorded: 0.01 }] : [],
    );
    expect((await worker.client.infer(request('full'))).response?.outputs[0]?.shape).toEqual([1n, 3n]);
  });

  it('reads large weights from the cached artifact through a link of their own, gone after the load, and from the bytes when that cannot serve', async () => {
    // 4 -> 8192 -> 3: both weights (128 and 96 KiB) are large enough to be read as external data.
    const wide = buildMlpModel({ sizes: [4, 8192, 3], name: 'wide' });
    const other = buildMlpModel({ sizes: [4, 8192, 3], name: 'other', seed: 7 });
    const registry = new InMemoryRegistry();
    // What a worker that stopped mid-load left in its artifact directory.
    const artifactDir = mkdtempSync(join(tmpdir(), 'worker-artifacts-'));
    try {
      const stale = join(artifactDir, '.load-left');
      mkdirSync(stale);
      writeFileSync(join(stale, 'model.onnx'), wide.bytes);
      worker = await startWorker(registry, { WORKER_ARTIFACT_DIR: artifactDir });
      const runtime = worker.running.app.get(ModelRuntime);
      const loads = jest.spyOn(runtime, 'load');
      const x = Float32Array.from({ length: 8 }, (_, i) => Math.cos(i));
      const answer = async (model: string) => {
        const { response } = await worker!.client.infer({
          request: {
            modelName: model,
            modelVersion: '1',
            inputs: [{ name: 'input', datatype: DataType.FP32, shape: [2n, 4n], data: new Uint8Array(x.buffer) }],
          },
        });
        return Buffer.from(response!.outputs[0]!.data);
      };
      const inProcess = async (bytes: Uint8Array) => {
        const session = await ort.InferenceSession.create(bytes);
        try {
          const outputs = await session.run({ input: new ort.Tensor('float32', x, [2, 4]) });
          return Buffer.from((Object.values(outputs)[0]!.data as Float32Array).buffer);
        } finally {
          await session.release();
        }
      };

      registry.add('wide', wide.bytes);
      expect(await answer('wide')).toEqual(await inProcess(wide.bytes));
      const weightsDir = loads.mock.calls.at(-1)![3]?.weightsDir;
      expect(weightsDir).toMatch(/[/\\]\.load-[^/\\]+$/);
      expect(existsSync(weightsDir!)).toBe(false);
      expect(readdirSync(artifactDir).filter((name) => name.startsWith('.load-'))).toEqual([]);

      // The copy cannot serve (as when it was deleted to make room meanwhile): the load goes on from the bytes.
      loads.mockImplementationOnce(() => Promise.reject(new ModelLoadError('the file is gone')));
      registry.add('other', other.bytes);
      expect(await answer('other')).toEqual(await inProcess(other.bytes));
      expect(loads.mock.calls.slice(-2).map((call) => call[3]?.weightsDir !== undefined)).toEqual([true, false]);
      expect(registry.reports.filter((r) => r.state === VersionState.FAILED)).toEqual([]);
    } finally {
      rmSync(artifactDir, { recursive: true, force: true });
    }
  });

  it("refuses an artifact whose bytes do not match the registry's SHA-256 and never loads it", async () => {
    const registry = new InMemoryRegistry();
    const good = buildTinyModel().bytes;
    const corrupted = Uint8Array.from(good);
    corrupted[corrupted.length - 1]! ^= 0xff;
    registry.add('corrupt', good, { serve: corrupted });
    worker = await startWorker(registry, {});
    await until(async () => registry.reports.some((r) => r.state === VersionState.FAILED));
    const report = registry.reports.find((r) => r.state === VersionState.FAILED)!;
    expect(report.reason).toMatch(
      /artifact refused: artifact [0-9a-f]{64} failed verification: the downloaded bytes hash to [0-9a-f]{64}/,
    );
    expect(await states(worker.client)).toEqual({ corrupt: 'FAILED' });
    const error = await rpcRejection(worker.client.infer(request('corrupt')));
    expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
    const text = await worker.metrics();
    expect(metric(text, 'artifact_verification_failures_total{model="corrupt"}')).toBe(1);
    expect(metric(text, 'model_loads_total{outcome="ready"}')).toBe(0);
  });

  it('warms up at every configured batch size: a model that breaks at its max batch serves unwarmed with a synthetic warm-up, and FAILS with a given one', async () => {
    // Reshape to [1, 4] works for a batch of 1 and fails for any other.
    const batchOfOne = encodeModel('batch-of-one', {
      nodes: [node('Reshape', ['input', 'shape'], ['output'], 'reshape')],
      initializers: [
        { name: 'shape', dims: [2], dataType: 7, rawData: new Uint8Array(BigInt64Array.of(1n, 4n).buffer) },
      ],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [1, 4] }],
    });
    const registry = new InMemoryRegistry();
    registry.add('batch-of-one', batchOfOne.bytes, { maxBatchSize: 16 });
    registry.add('batch-of-one-given', batchOfOne.bytes, {
      maxBatchSize: 16,
      warmUp: {
        samples: [
          {
            inputs: [
              {
                name: 'input',
                datatype: DataType.FP32,
                shape: [1n, 4n],
                contents: { case: 'randomData', value: true },
              },
            ],
          },
        ],
      },
    });
    registry.add('tiny', buildTinyModel().bytes, { maxBatchSize: 16 });
    worker = await startWorker(registry, { WORKER_WARMUP_BATCH_SIZES: '1,max' });
    await until(
      async () =>
        registry.reports.filter((r) => r.state === VersionState.READY || r.state === VersionState.FAILED).length === 3,
    );
    const outcome = (model: string) =>
      registry.reports.find((r) => r.name === `models/${model}/versions/1` && r.state !== VersionState.LOADING)!;
    expect(outcome('batch-of-one')).toMatchObject({
      state: VersionState.READY,
      warmUpError: expect.stringMatching(/^synthetic warm-up at batch 16 failed on cpu: /),
    });
    expect(outcome('batch-of-one-given')).toMatchObject({
      state: VersionState.FAILED,
      reason: expect.stringMatching(/^warm-up sample 1 at batch 16 failed on cpu: .*Reshape/),
    });
    expect(outcome('tiny')).toMatchObject({ state: VersionState.READY, warmUpError: '' });
    expect(await states(worker.client)).toEqual({
      'batch-of-one': 'READY',
      'batch-of-one-given': 'FAILED',
      tiny: 'READY',
    });
    // It serves what it can: a batch of one.
    expect((await worker.client.infer(request('batch-of-one'))).response!.outputs[0]!.shape).toEqual([1n, 4n]);
  });

  describe('warm-up of models that synthetic inputs do not suit', () => {
    const floats = (values: number[]) => new Uint8Array(Float32Array.from(values).buffer);
    const rate = (sr: number) => new Uint8Array(BigInt64Array.of(BigInt(sr)).buffer);
    const audio = Array.from({ length: 512 }, (_, i) => Math.sin(i / 10));
    const padSample = {
      inputs: [{ name: 'audio', shape: [1n, 512n], contents: { case: 'data' as const, value: floats(audio) } }],
    };
    const rateSample = (sr: number) => ({
      name: `${sr} Hz`,
      inputs: [
        { name: 'audio', shape: [1n, 512n], contents: { case: 'randomData' as const, value: true } },
        { name: 'sr', shape: [1n], contents: { case: 'data' as const, value: rate(sr) } },
      ],
    });

    /** What onnxruntime-node answers in-process for the same model and inputs. */
    async function direct(bytes: Uint8Array, feeds: Record<string, ort.Tensor>): Promise<Record<string, number[]>> {
      const session = await ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
      const out = await session.run(feeds);
      await session.release();
      return Object.fromEntries(Object.entries(out).map(([name, t]) => [name, Array.from(t.data as Float32Array)]));
    }
    const served = (outputs: readonly Tensor[]) =>
      Object.fromEntries(outputs.map((t) => [t.name, Array.from(new Float32Array(Uint8Array.from(t.data).buffer))]));
    const inferOn = (model: string, inputs: Tensor[]) =>
      worker!.client.infer({ request: { modelName: model, modelVersion: '1', id: model, inputs } });
    const listed = async () =>
      Object.fromEntries(
        (await worker!.client.listModels({})).models.map((m) => [
          m.name.split('/')[1]!,
          [ModelState[m.state], m.warmUpError, m.stateReason],
        ]),
      );

    it('warms them up on the samples given and answers like onnxruntime-node in-process; without samples they serve unwarmed, saying why', async () => {
      const pad = buildReflectPadModel();
      const sampleRate = buildSampleRateModel();
      const registry = new InMemoryRegistry();
      registry.add('pad-warmed', pad.bytes, { maxBatchSize: 64, warmUp: { samples: [padSample] } });
      registry.add('pad-cold', pad.bytes, { maxBatchSize: 64 });
      registry.add('rate-warmed', sampleRate.bytes, {
        maxBatchSize: 0,
        warmUp: { samples: [rateSample(8000), rateSample(16000)] },
      });
      registry.add('rate-cold', sampleRate.bytes, { maxBatchSize: 0 });
      worker = await startWorker(registry, { WORKER_WARMUP_BATCH_SIZES: '1,max' });
      await until(
        async () =>
          registry.reports.filter((r) => r.state === VersionState.READY || r.state === VersionState.FAILED).length ===
          4,
      );

      expect(await listed()).toEqual({
        'pad-warmed': ['READY', '', ''],
        'pad-cold': [
          'READY',
          expect.stringMatching(
            /^synthetic warm-up at batch 1 failed on cpu: .*Pad reflect requires axis length >= 2.*infermesh models register --warmup/,
          ),
          '',
        ],
        'rate-warmed': ['READY', '', ''],
        'rate-cold': [
          'READY',
          expect.stringMatching(/^synthetic warm-up at batch 1 failed on cpu: .*indices element out of data bounds/),
          '',
        ],
      });
      expect(registry.versions.get('models/pad-cold/versions/1')!.warmUpError).toMatch(
        /Pad reflect requires axis length >= 2/,
      );
      expect(registry.versions.get('models/pad-warmed/versions/1')!.warmUpError).toBe('');

      const rows = [audio.slice(0, 300), audio.slice(100, 400)].flat();
      const padInput = create(TensorSchema, {
        name: 'audio',
        datatype: DataType.FP32,
        shape: [2n, 300n],
        data: floats(rows),
      });
      const padExpected = await direct(pad.bytes, {
        audio: new ort.Tensor('float32', Float32Array.from(rows), [2, 300]),
      });
      for (const model of ['pad-warmed', 'pad-cold'])
        expect(served((await inferOn(model, [padInput])).response!.outputs)).toEqual(padExpected);

      const clip = audio.slice(0, 64);
      for (const sr of [8000, 16000]) {
        const inputs = [
          create(TensorSchema, { name: 'audio', datatype: DataType.FP32, shape: [1n, 64n], data: floats(clip) }),
          create(TensorSchema, { name: 'sr', datatype: DataType.INT64, shape: [1n], data: rate(sr) }),
        ];
        const expected = await direct(sampleRate.bytes, {
          audio: new ort.Tensor('float32', Float32Array.from(clip), [1, 64]),
          sr: new ort.Tensor('int64', BigInt64Array.of(BigInt(sr)), [1]),
        });
        for (const model of ['rate-warmed', 'rate-cold'])
          expect(served((await inferOn(model, inputs)).response!.outputs)).toEqual(expected);
      }
    });

    it("FAILS a version whose given samples the model refuses, with onnxruntime's message naming the sample", async () => {
      const registry = new InMemoryRegistry();
      registry.add('pad-short', buildReflectPadModel().bytes, {
        maxBatchSize: 64,
        warmUp: {
          samples: [
            {
              name: 'one sample',
              inputs: [{ name: 'audio', shape: [1n, 1n], contents: { case: 'zeroData', value: true } }],
            },
          ],
        },
      });
      registry.add('rate-44k', buildSampleRateModel().bytes, {
        maxBatchSize: 0,
        warmUp: { samples: [rateSample(16000), rateSample(44100)] },
      });
      worker = await startWorker(registry, {});
      await until(async () => registry.reports.filter((r) => r.state === VersionState.FAILED).length === 2);

      expect(await listed()).toEqual({
        'pad-short': [
          'FAILED',
          '',
          expect.stringMatching(/^warm-up sample "one sample" failed on cpu: .*Pad reflect requires axis length >= 2/),
        ],
        'rate-44k': [
          'FAILED',
          '',
          expect.stringMatching(
            /^warm-up sample "44100 Hz" failed on cpu: .*Gather node.*indices element out of data bounds/,
          ),
        ],
      });
      const refused = await rpcRejection(inferOn('rate-44k', []));
      expect(refused.code).toBe(status.UNAVAILABLE);
      expect(refused.message).toMatch(/failed to load: warm-up sample "44100 Hz" failed/);
    });
  });

  it('on shutdown says NOT_SERVING, refuses new requests with UNAVAILABLE and finishes those running', async () => {
    const registry = new InMemoryRegistry();
    registry.add('mlp', buildMlpModel().bytes, { maxBatchSize: 0 });
    registry.add('tiny', buildTinyModel().bytes, { maxBatchSize: 0 });
    worker = await startWorker(registry, {});
    await until(async () => Object.values(await states(worker!.client)).join() === 'READY,READY');
    const rows = 4096;
    const running = worker.client.infer({
      request: {
        modelName: 'mlp',
        modelVersion: '1',
        inputs: [
          create(TensorSchema, {
            name: 'input',
            datatype: DataType.FP32,
            shape: [BigInt(rows), 512n],
            data: new Uint8Array(rows * 2048),
          }),
        ],
      },
    });
    await until(async () => metric(await worker!.metrics(), 'inference_requests_in_flight') === 1);
    const stopped = worker.running.stop();
    expect(
      (
        await worker.health
          .check({ service: '' })
          .catch(() => ({ status: HealthCheckResponse_ServingStatus.NOT_SERVING }))
      ).status,
    ).toBe(HealthCheckResponse_ServingStatus.NOT_SERVING);
    expect((await running).response?.outputs[0]?.shape).toEqual([BigInt(rows), 512n]);
    const refused = await rpcRejection(worker.client.infer(request('tiny')));
    expect(refused.code).toBe(status.UNAVAILABLE);
    await stopped;
  });

  it('serves only the models WORKER_MODELS places on it: never loads or reports another, and refuses it with FAILED_PRECONDITION naming the model and the worker', async () => {
    const registry = new InMemoryRegistry();
    registry.add('tiny', buildTinyModel().bytes);
    registry.add('elsewhere', buildMlpModel({ sizes: [4, 8, 3], seed: 3 }).bytes);
    registry.change('elsewhere', { pinned: true }); // the registry's pin does not place a model either
    worker = await startWorker(registry, { WORKER_MODELS: 'tiny' });
    await until(async () => registry.versions.get('models/tiny/versions/1')!.state === VersionState.READY);
    const listed = registry.lists;
    await until(async () => registry.lists >= listed + 3); // several syncs

    expect((await worker.client.listModels({})).placedModels).toEqual(['tiny']);
    expect(await states(worker.client)).toEqual({ tiny: 'READY' });
    expect(registry.reports.filter((r) => r.name.includes('elsewhere'))).toEqual([]);
    expect(registry.versions.get('models/elsewhere/versions/1')!.state).toBe(VersionState.REGISTERED);
    for (const refused of [
      await rpcRejection(worker.client.infer(request('elsewhere'))),
      await rpcRejection(worker.client.loadModel({ name: 'models/elsewhere/versions/1' })),
    ]) {
      expect([refused.code, refused.reason]).toEqual([status.FAILED_PRECONDITION, 'MODEL_NOT_PLACED']);
      expect(refused.message).toContain(
        'model "elsewhere" is not placed on worker worker-under-test, which serves only "tiny" (WORKER_MODELS)',
      );
    }
    expect(await states(worker.client)).toEqual({ tiny: 'READY' });
    expect(registry.downloads).toBe(1);
    expect((await worker.client.infer(request('tiny'))).response?.outputs[0]?.shape).toEqual([1n, 3n]);
  });

  it('keeps answering while the registry is down and says which models it does not know', async () => {
    const registry = new InMemoryRegistry();
    let attempts = 0;
    registry.listModels = () => {
      attempts += 1;
      return Promise.reject(new Error('connection refused'));
    };
    worker = await startWorker(registry, {});
    await until(async () => attempts >= 3); // several syncs against the dead registry
    expect((await worker.health.check({ service: '' })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect(await worker.client.listModels({})).toMatchObject({
      workerId: 'worker-under-test',
      models: [],
      placedModels: [],
    });
    const error = await rpcRejection(worker.client.infer(request('tiny')));
    expect([error.code, error.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
    expect(metric(await worker.metrics(), 'registry_sync_failures_total')).toBeGreaterThan(1);
  });

  describe('following the registry watch', () => {
    let registry: InMemoryRegistry;

    beforeEach(async () => {
      registry = await new InMemoryRegistry().serveWatch();
    });

    afterEach(async () => {
      await worker?.stop();
      worker = undefined;
      await registry.stopWatch();
    });

    /** The worker following the registry's watch; the periodic sync is an hour away, so only the watch brings changes. */
    async function follow(env: Record<string, string> = {}): Promise<Worker> {
      worker = await startWorker(registry, {
        WORKER_REGISTRY_ADDRESS: registry.watchAddress,
        WORKER_SYNC_INTERVAL_MS: '3600000',
        ...env,
      });
      await worker.running.app.get(RegistryWatch).ready();
      return worker;
    }

    /** Waits until the worker's watch has every change made so far, then for a sync after it. */
    async function settled(): Promise<void> {
      const { app } = worker!.running;
      await until(async () => app.get(RegistryWatch).revision === registry.currentRevision);
      await app.get(ModelSync).syncNow();
    }

    /** What the worker lists, by version name. */
    const listed = async (): Promise<Record<string, string>> =>
      Object.fromEntries((await worker!.client.listModels({})).models.map((m) => [m.name, ModelState[m.state]]));
    const inferOn = (model: string, version: string) =>
      worker!.client.infer({ request: { modelName: model, modelVersion: version, inputs: [input(1)] } });

    it('loads a new version as soon as the watch tells, keeps a DRAINING one serving, and frees what the registry stops serving', async () => {
      const tiny = buildTinyModel().bytes;
      await follow();
      registry.add('tiny', tiny);
      await until(async () => (await listed())['models/tiny/versions/1'] === 'READY');
      registry.add('tiny', tiny, { version: '2' });
      await until(async () => (await listed())['models/tiny/versions/2'] === 'READY');

      registry.change('tiny', { version: '1', state: VersionState.DRAINING });
      await settled();
      expect(await listed()).toEqual({ 'models/tiny/versions/1': 'READY', 'models/tiny/versions/2': 'READY' });
      expect((await inferOn('tiny', '1')).response?.modelVersion).toBe('1');

      registry.change('tiny', { version: '1', state: VersionState.RETIRED });
      await settled();
      expect(await listed()).toEqual({ 'models/tiny/versions/2': 'READY' });

      // Unloaded: the serving version drains, then goes back to REGISTERED, which is not loaded again.
      registry.change('tiny', { unloaded: true, version: '2', state: VersionState.DRAINING });
      await settled();
      expect(await listed()).toEqual({ 'models/tiny/versions/2': 'READY' });
      registry.change('tiny', { version: '2', state: VersionState.REGISTERED });
      await settled();
      expect(await listed()).toEqual({});
      const refused = await rpcRejection(inferOn('tiny', '2'));
      expect([refused.code, refused.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);

      // Loaded again: the REGISTERED version loads ahead of requests.
      registry.change('tiny', { unloaded: false });
      await until(async () => (await listed())['models/tiny/versions/2'] === 'READY');
      expect(metric(await worker!.metrics(), 'model_unloads_total{reason="retired"}')).toBe(2);
    });

    it('keeps serving while the registry is down and says so at GET /health', async () => {
      registry.add('tiny', buildTinyModel().bytes);
      await follow();
      await until(async () => (await listed())['models/tiny/versions/1'] === 'READY');

      await registry.stopWatch();
      registry.listModels = () => Promise.reject(new Error('connection refused'));
      await until(async () => !worker!.running.app.get(RegistryWatch).status().connected);
      await worker!.running.app.get(ModelSync).syncNow();

      expect((await inferOn('tiny', '1')).response?.modelName).toBe('tiny');
      expect((await worker!.health.check({ service: '' })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
      const response = await fetch(`http://127.0.0.1:${worker!.running.metricsPort}/health`);
      expect(response.status).toBe(200);
      expect(await response.json()).toMatchObject({
        service: 'worker',
        status: 'SERVING',
        registry: { address: registry.watchAddress, connected: false, serving_last_config: true, models: 1 },
      });
    });

    it('loads a model the registry pins ahead of requests and never evicts it, until the registry unpins it', async () => {
      registry.add('pinned', buildPaddedModel(64 * MiB, 1).bytes);
      registry.add('big', buildPaddedModel(64 * MiB, 2).bytes);
      registry.change('pinned', { state: VersionState.READY, pinned: true });
      registry.change('big', { state: VersionState.READY });
      await follow({ WORKER_MEMORY_BUDGET_BYTES: '100MiB' });
      await until(async () => (await listed())['models/pinned/versions/1'] === 'READY');

      const error = await rpcRejection(inferOn('big', '1'));
      expect([error.code, error.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'MEMORY_BUDGET_EXCEEDED']);
      expect(
        (await worker!.client.listModels({})).models.find((m) => m.name === 'models/pinned/versions/1')?.pinned,
      ).toBe(true);

      registry.change('pinned', { pinned: false });
      await settled();
      expect((await inferOn('big', '1')).response?.modelName).toBe('big');
      expect(await listed()).toEqual({ 'models/pinned/versions/1': 'UNLOADED', 'models/big/versions/1': 'READY' });
    });

    it('drops a load under way when the registry retires the version', async () => {
      let release!: () => void;
      registry.hold = new Promise<void>((resolve) => (release = resolve));
      registry.add('tiny', buildTinyModel().bytes);
      await follow();
      await until(async () => registry.reports.some((r) => r.state === VersionState.LOADING));

      registry.change('tiny', { state: VersionState.RETIRED });
      await settled();
      expect(await listed()).toEqual({});
      release();

      await until(async () => metric(await worker!.metrics(), 'model_loads_total{outcome="interrupted"}') === 1);
      expect(metric(await worker!.metrics(), 'model_loads_total{outcome="ready"}')).toBe(0);
      expect(registry.reports.map((r) => VersionState[r.state])).toEqual(['LOADING']);
    });

    it('unloads a retired version only once the request running on it has finished', async () => {
      registry.add('mlp', buildMlpModel().bytes, { maxBatchSize: 0 });
      await follow();
      await until(async () => (await listed())['models/mlp/versions/1'] === 'READY');
      const rows = 4096;
      const running = worker!.client.infer({
        request: {
          modelName: 'mlp',
          modelVersion: '1',
          inputs: [
            create(TensorSchema, {
              name: 'input',
              datatype: DataType.FP32,
              shape: [BigInt(rows), 512n],
              data: new Uint8Array(rows * 2048),
            }),
          ],
        },
      });
      await until(async () => metric(await worker!.metrics(), 'inference_requests_in_flight') === 1);

      registry.change('mlp', { state: VersionState.RETIRED });
      await settled();

      expect(await listed()).toEqual({});
      expect((await running).response?.outputs[0]?.shape).toEqual([BigInt(rows), 512n]);
      await until(async () => metric(await worker!.metrics(), 'models_loaded{device="cpu"}') === 0);
      expect(metric(await worker!.metrics(), 'model_unloads_total{reason="retired"}')).toBe(1);
    });
  });
});

describe(loadWorkerConfig.name, () => {
  it('applies the defaults', () => {
    const sut = loadWorkerConfig({});
    expect(sut).toMatchObject({
      registryAddress: '127.0.0.1:50051',
      executionProviders: ['cuda', 'cpu'],
      syncIntervalMs: 5000,
      instancesPerModel: 1,
      warmupBatchSizes: [1, 'max'],
      loadTimeoutMs: 120_000,
      runtime: { grpc: { port: 50055 }, metrics: { port: 9105 } },
    });
    expect(sut.intraOpThreads).toBeGreaterThanOrEqual(1);
    expect(sut.memoryBudgetBytes).toBeGreaterThan(0);
    expect(sut.pinnedModels.size).toBe(0);
    expect(sut.placedModels.size).toBe(0);
    expect(sut.workerId).toMatch(new RegExp(`-${process.pid}$`));
    expect(sut.artifactDir).toMatch(/\.infermesh\/worker-artifacts$/);
  });

  it('shares the cores out among instances by default', () => {
    expect(loadWorkerConfig({ WORKER_INSTANCES_PER_MODEL: '2' }).intraOpThreads).toBe(
      Math.max(1, Math.floor(availableParallelism() / 2)),
    );
    expect(loadWorkerConfig({ WORKER_INSTANCES_PER_MODEL: '2', WORKER_INTRA_OP_THREADS: '3' }).intraOpThreads).toBe(3);
  });

  it('runs a thread for each instance of each model unless told a limit, never below the instances of one', () => {
    expect(loadWorkerConfig({}).executionThreads).toBeUndefined();
    expect(loadWorkerConfig({ WORKER_INSTANCES_PER_MODEL: '3' }).executionThreads).toBeUndefined();
    expect(loadWorkerConfig({ WORKER_INSTANCES_PER_MODEL: '2', WORKER_EXECUTION_THREADS: '4' }).executionThreads).toBe(
      4,
    );
    expect(() => loadWorkerConfig({ WORKER_INSTANCES_PER_MODEL: '2', WORKER_EXECUTION_THREADS: '1' })).toThrow(
      /WORKER_EXECUTION_THREADS: 1 is fewer than WORKER_INSTANCES_PER_MODEL \(2\)/,
    );
    expect(() => loadWorkerConfig({ WORKER_EXECUTION_THREADS: '0' })).toThrow(/WORKER_EXECUTION_THREADS/);
  });

  it('schedules the compute 10 nice steps below the main thread unless told otherwise, 0 to 19', () => {
    expect(loadWorkerConfig({}).computeNice).toBe(10);
    expect(loadWorkerConfig({ WORKER_COMPUTE_NICE: '0' }).computeNice).toBe(0);
    expect(() => loadWorkerConfig({ WORKER_COMPUTE_NICE: '20' })).toThrow(/WORKER_COMPUTE_NICE.*expected 0 to 19/);
    expect(() => loadWorkerConfig({ WORKER_COMPUTE_NICE: '-1' })).toThrow(/WORKER_COMPUTE_NICE.*expected 0 to 19/);
  });

  it('reads the placement: the models the worker serves, which must include the pinned ones', () => {
    expect([...loadWorkerConfig({ WORKER_MODELS: ' primary , backup,' }).placedModels]).toEqual(['primary', 'backup']);
    expect([...loadWorkerConfig({ WORKER_MODELS: 'primary', WORKER_PINNED_MODELS: 'primary' }).pinnedModels]).toEqual([
      'primary',
    ]);
    expect(() => loadWorkerConfig({ WORKER_MODELS: 'a b' })).toThrow(/WORKER_MODELS/);
    expect(() => loadWorkerConfig({ WORKER_MODELS: 'primary', WORKER_PINNED_MODELS: 'primary,backup' })).toThrow(
      /WORKER_PINNED_MODELS: "backup" not in WORKER_MODELS/,
    );
  });

  it('names the variable that is wrong', () => {
    expect(() => loadWorkerConfig({ WORKER_EXECUTION_PROVIDERS: ' , ' })).toThrow(/WORKER_EXECUTION_PROVIDERS/);
    expect(() => loadWorkerConfig({ WORKER_REGISTRY_ADDRESS: 'nowhere' })).toThrow(/WORKER_REGISTRY_ADDRESS/);
    expect(() => loadWorkerConfig({ WORKER_MEMORY_BUDGET_BYTES: 'lots' })).toThrow(/WORKER_MEMORY_BUDGET_BYTES/);
    expect(() => loadWorkerConfig({ WORKER_WARMUP_BATCH_SIZES: '1,0' })).toThrow(/WORKER_WARMUP_BATCH_SIZES/);
    expect(() => loadWorkerConfig({ WORKER_PINNED_MODELS: 'a b' })).toThrow(/WORKER_PINNED_MODELS/);
  });
});
