import 'reflect-metadata';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { GrpcServer, RpcError, type ServiceImpl } from '@infermesh/grpc';
import { InferParameterSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type BatchingSchema,
  ModelVersionSchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { encodeBytesElements, decodeBytesElements } from '@infermesh/tensors';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { RegistryWatch } from '@infermesh/registry-watch';
import { HealthDetails } from '@infermesh/runtime';
import { eventually, FakeRegistry, rpcRejection } from '@infermesh/testing';
import { loadBatcherConfig } from './batcher.config';
import { BatcherModule } from './batcher.module';
import { CALLER_DEADLINE_SKEW_MS, Scheduler } from './scheduler';
import { WorkerPool } from './worker-pool';

// ---------------------------------------------------------------------------------------------
// Fakes of the batcher's upstreams, served by the real GrpcServer over real sockets: workers that
// echo their input "x" as output "y" (row by row, so a wrong split shows), and a registry that
// answers each version's signature and batching.
// ---------------------------------------------------------------------------------------------

const v = (model: string, version: string) => `models/${model}/versions/${version}`;

class FakeWorker {
  /** Resource name -> state reported by ListModels. */
  readonly models = new Map<string, ModelState>();
  /** The models it says it serves (its WORKER_MODELS); empty: every model. */
  placement: string[] = [];
  readonly received: InferenceRequest[] = [];
  listCalls = 0;
  /** Thrown by Infer when set. */
  failWith: RpcError | undefined;
  /** While set, Infer waits for it before answering. */
  hold: Promise<void> | undefined;
  /** Time each Infer takes. */
  delayMs = 0;
  /** Changes the echo, to return a broken batch. */
  mangle: ((response: { outputs: { shape: bigint[] }[] }) => void) | undefined;
  address = '';
  private server: GrpcServer | undefined;

  constructor(readonly id: string) {}

  async start(): Promise<this> {
    const impl: ServiceImpl<typeof WorkerService> = {
      listModels: async () => {
        this.listCalls += 1;
        return {
          workerId: this.id,
          models: [...this.models].map(([name, state]) => ({ name, state })),
          placedModels: this.placement,
        };
      },
      infer: async ({ request }) => {
        const req = request!;
        this.received.push(req);
        if (this.hold) await this.hold;
        if (this.delayMs > 0) await new Promise((r) => setTimeout(r, this.delayMs));
        if (this.failWith) throw this.failWith;
        const x = req.inputs.find((i) => i.name === 'x');
        const response = {
          modelName: req.modelName,
          modelVersion: req.modelVersion,
          id: req.id,
          outputs: x === undefined ? [] : [{ name: 'y', datatype: x.datatype, shape: x.shape, data: x.data }],
        };
        this.mangle?.(response);
        return { response };
      },
      loadModel: () => Promise.reject(RpcError.invalidArgument('the batcher never loads models explicitly')),
      unloadModel: () => Promise.reject(RpcError.invalidArgument('the batcher never unloads models')),
    };
    this.server = new GrpcServer({
      logger: new JsonLogger(this.id, 'error'),
      metrics: new Metrics('fake_worker'),
      maxMessageBytes: 1 << 20,
    });
    this.server.add(WorkerService, impl);
    this.address = `127.0.0.1:${await this.server.listen('127.0.0.1', 0)}`;
    return this;
  }

  async stop(): Promise<void> {
    await this.server?.shutdown(10);
    this.server = undefined;
  }
}

/**
 * The registry: ResolveModelVersion answers each version's signature and batching. Once a model is put,
 * WatchModels follows its contract; before, it is UNIMPLEMENTED, and the batcher reads the settings
 * with ResolveModelVersion.
 */
class BatchingRegistry extends FakeRegistry {
  /** Batching by resource name; versions not named here have none (every default). */
  readonly batching = new Map<string, MessageInitShape<typeof BatchingSchema>>();
  maxBatchSize = 8;
  resolveCalls = 0;

  constructor() {
    super({
      watchOnlyOnceChanged: true,
      handlers: {
        resolveModelVersion: async ({ model, versionId }) => {
          this.resolveCalls += 1;
          const name = `${model}/versions/${versionId}`;
          const batching = this.batching.get(name);
          return {
            version: create(ModelVersionSchema, {
              name,
              state: VersionState.READY,
              signature: { maxBatchSize: this.maxBatchSize },
              ...(batching !== undefined && { batching }),
            }),
          };
        },
      },
    });
  }
}

/** A request of `rows` items of [rows, width] FP32, each element holding its row's tag. */
function rowsRequest(
  id: string,
  rows: number,
  tag: number,
  init: MessageInitShape<typeof InferenceRequestSchema> = {},
  width = 2,
): InferenceRequest {
  const data = new Float32Array(rows * width);
  for (let r = 0; r < rows; r++) data.fill(tag + r, r * width, (r + 1) * width);
  return create(InferenceRequestSchema, {
    modelName: 'mlp',
    modelVersion: '1',
    id,
    inputs: [
      { name: 'x', datatype: DataType.FP32, shape: [BigInt(rows), BigInt(width)], data: new Uint8Array(data.buffer) },
    ],
    ...init,
  });
}

const rowsOf = (response: InferenceResponse) => {
  const y = response.outputs.find((o) => o.name === 'y')!;
  const values = new Float32Array(Uint8Array.from(y.data).buffer);
  const width = Number(y.shape[1]);
  return Array.from({ length: Number(y.shape[0]) }, (_, r) => values[r * width]);
};

const priority = (level: number) => ({
  priority: create(InferParameterSchema, { parameterChoice: { case: 'int64Param', value: BigInt(level) } }),
});

/** What a gRPC call gives the scheduler: no deadline unless given, a live signal unless given. */
const call = (options: { deadlineMs?: number; signal?: AbortSignal } = {}) => ({
  requestId: 'test',
  deadlineMs: options.deadlineMs,
  signal: options.signal ?? new AbortController().signal,
});

/** Holds the worker on a first request ("blocker") until release(), so that what follows queues behind it. */
async function occupy(
  sut: Scheduler,
  worker: FakeWorker,
  tag = 0,
): Promise<{ blocker: Promise<InferenceResponse>; release: () => void }> {
  const held = gate();
  worker.hold = held.promise;
  const blocker = sut.infer(rowsRequest('blocker', 1, tag), call());
  await eventually(() => worker.received.length === 1);
  return {
    blocker,
    release: () => {
      held.open();
      worker.hold = undefined;
    },
  };
}

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

describe(Scheduler.name, () => {
  let workers: FakeWorker[];
  let registry: BatchingRegistry;
  let app: INestApplicationContext | undefined;

  /** Starts the batcher's Nest context against the fakes; the periodic poll is an hour away. */
  async function start(env: Record<string, string> = {}): Promise<Scheduler> {
    const config = loadBatcherConfig({
      BATCHER_LOG_LEVEL: 'error',
      BATCHER_WORKER_ADDRESSES: workers.map((w) => w.address).join(','),
      BATCHER_WORKER_POLL_MS: '3600000',
      BATCHER_WORKER_TIMEOUT_MS: '1000',
      BATCHER_REGISTRY_ADDRESS: registry.address,
      ...env,
    });
    app = await NestFactory.createApplicationContext(BatcherModule.forRoot(config), {
      logger: false,
      abortOnError: false,
    });
    return app.get(Scheduler);
  }

  async function metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const found = app!.get(Metrics).registry.getSingleMetric(`infermesh_batcher_${name}`);
    if (found === undefined) throw new Error(`no metric ${name}`);
    const { values } = await found.get();
    return values
      .filter((x) => Object.entries(labels).every(([k, l]) => x.labels[k] === l))
      .reduce((sum, x) => sum + x.value, 0);
  }

  /** Batches each worker received, as the number of items in each. */
  const batchSizes = (worker: FakeWorker) => worker.received.map((r) => Number(r.inputs[0]?.shape[0] ?? 0));

  beforeEach(async () => {
    workers = await Promise.all([new FakeWorker('w1').start(), new FakeWorker('w2').start()]);
    registry = await new BatchingRegistry().start();
  });

  afterEach(async () => {
    await app?.close();
    app = undefined;
    await Promise.all([...workers.map((w) => w.stop()), registry.stop()]);
  });

  describe('dispatch', () => {
    it('sends a request only to a worker that lists the version READY', async () => {
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.LOADING);
      w1.models.set(v('mlp', '2'), ModelState.READY);
      w2.models.set(v('mlp', '1'), ModelState.READY);
      w2.models.set(v('mlp', '2'), ModelState.FAILED);
      const sut = await start();

      for (const id of ['a', 'b', 'c']) {
        await expect(sut.infer(rowsRequest(id, 1, 0), call())).resolves.toMatchObject({ modelVersion: '1', id });
      }
      await sut.infer(rowsRequest('d', 1, 0, { modelVersion: '2' }), call());

      expect(w1.received.map((r) => r.id)).toEqual(['d']);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    });

    it.each(['least_outstanding', 'power_of_two'])(
      'sends a batch to the worker with the fewest outstanding batches (%s: of two, both are compared)',
      async (choice) => {
        for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
        const [w1, w2] = workers as [FakeWorker, FakeWorker];
        const sut = await start({ BATCHER_REPLICA_CHOICE: choice });
        const held = gate();
        w1.hold = held.promise;
        w2.hold = held.promise;

        // Both idle: the first batch may go to either; the second goes to the other, which has none.
        const first = sut.infer(rowsRequest('first', 1, 0), call());
        await eventually(() => w1.received.length + w2.received.length === 1);
        const second = sut.infer(rowsRequest('second', 1, 0), call());
        await eventually(() => w1.received.length + w2.received.length === 2);
        held.open();
        await expect(Promise.all([first, second])).resolves.toMatchObject([{ id: 'first' }, { id: 'second' }]);

        expect([w1.received.length, w2.received.length]).toEqual([1, 1]);
      },
    );

    it('keeps at most BATCHER_MAX_BATCHES_PER_WORKER batches on a worker; the queue waits for one to finish', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const held = gate();
      w1.hold = held.promise;

      const answers = Promise.all(['a', 'b', 'c'].map((id, i) => sut.infer(rowsRequest(id, 1, i), call())));
      await eventually(() => w1.received.length === 1);
      await new Promise((r) => setTimeout(r, 30));
      expect(w1.received).toHaveLength(1);
      held.open();
      w1.hold = undefined;
      await answers;

      // The two that queued behind the first batch went together.
      expect(batchSizes(w1)).toEqual([1, 2]);
    });

    it('retries a batch once on another worker when its worker is unreachable, and skips that worker afterwards', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      await w1.stop();

      await expect(sut.infer(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a', modelVersion: '1' });
      expect(await metric('retries_total', { model: 'mlp' })).toBe(1);

      await expect(sut.infer(rowsRequest('b', 1, 0), call())).resolves.toMatchObject({ id: 'b' });
      expect(await metric('retries_total', { model: 'mlp' })).toBe(1);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b']);
    });

    it('retries a worker that refuses with UNAVAILABLE and a reason on another, but keeps the refusing worker', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      w1.failWith = RpcError.unavailable('the worker is shutting down', 'SHUTTING_DOWN');

      await expect(sut.infer(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a' });
      expect(w2.received.map((r) => r.id)).toEqual(['a']);
      expect(await metric('retries_total')).toBe(1);

      w1.failWith = undefined;
      await sut.infer(rowsRequest('b', 1, 0), call());
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b']);
    });

    it("ejects a worker that fails as the edge's outlier detection says, and sends it nothing until the ejection ends", async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      app!.get(WorkerPool).configureEdge({
        retry: { on: ['unavailable'], attempts: 1, backoff: { baseMs: 0, maxMs: 0 }, perTryTimeoutMs: undefined },
        outlierDetection: {
          consecutiveFailures: 2,
          consecutiveGatewayFailures: 0,
          interval: 200,
          baseEjectionTime: 600,
          maxEjectionPercent: 50,
        },
      });
      w1.failWith = new RpcError(status.INTERNAL, 'the session failed');
      w2.failWith = new RpcError(status.INTERNAL, 'the session failed');

      // Two failures in a row on each; the second worker is not ejected: 50 % of two are out already.
      for (const id of ['a', 'b', 'c', 'd']) await rpcRejection(sut.infer(rowsRequest(id, 1, 0), call()));
      expect(await metric('worker_ejections_total')).toBe(1);
      expect(await metric('workers_ejected')).toBe(1);
      w1.failWith = undefined;
      w2.failWith = undefined;
      const ejected =
        w1.received.length === 2 && w2.received.length === 2
          ? undefined
          : w1.received.length > w2.received.length
            ? w1
            : w2;
      const [out, kept] = ejected === w2 ? [w2, w1] : [w1, w2];
      const outBefore = out.received.length;
      for (const id of ['e', 'f', 'g']) await sut.infer(rowsRequest(id, 1, 0), call());
      expect(out.received).toHaveLength(outBefore);
      expect(kept.received.map((r) => r.id).slice(-3)).toEqual(['e', 'f', 'g']);

      // The ejection (600 ms) ends at a sweep; then the worker takes batches again.
      await eventually(() => app!.get(WorkerPool).available(v('mlp', '1')).length === 2, 2_000);
      for (const id of ['h', 'i', 'j', 'k']) await sut.infer(rowsRequest(id, 1, 0), call());
      expect(out.received.length).toBeGreaterThan(outBefore);
    });

    it('still sends to an ejected worker when every worker that holds the version is ejected (panic mode)', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start();
      app!.get(WorkerPool).configureEdge({
        retry: { on: ['unavailable'], attempts: 1, backoff: { baseMs: 0, maxMs: 0 }, perTryTimeoutMs: undefined },
        outlierDetection: {
          consecutiveFailures: 2,
          consecutiveGatewayFailures: 0,
          interval: 60_000,
          baseEjectionTime: 60_000,
          maxEjectionPercent: 100,
        },
      });
      w1.failWith = new RpcError(status.INTERNAL, 'the session failed');
      for (const id of ['a', 'b']) await rpcRejection(sut.infer(rowsRequest(id, 1, 0), call()));
      expect(await metric('workers_ejected')).toBe(1);
      w1.failWith = undefined;

      await expect(sut.infer(rowsRequest('c', 1, 0), call())).resolves.toMatchObject({ id: 'c' });
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    });

    it("retries a batch as many times as the edge's policy says, on another worker each time", async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      app!.get(WorkerPool).configureEdge({
        retry: { on: ['internal'], attempts: 3, backoff: { baseMs: 1, maxMs: 2 }, perTryTimeoutMs: undefined },
      });
      w1.failWith = new RpcError(status.INTERNAL, 'the session failed');
      w2.failWith = new RpcError(status.INTERNAL, 'the session failed');

      const error = await rpcRejection(sut.infer(rowsRequest('a', 1, 0), call()));

      expect(error.code).toBe(status.INTERNAL);
      expect(w1.received.length + w2.received.length).toBe(3);
      expect(await metric('retries_total')).toBe(2);
    });

    it('answers every request of a batch UNAVAILABLE when every worker holding the version is unreachable', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start();
      await Promise.all(workers.map((w) => w.stop()));

      const error = await rpcRejection(sut.infer(rowsRequest('a', 1, 0), call()));

      expect(error.code).toBe(status.UNAVAILABLE);
      expect(error.message).toContain('"mlp"');
      expect(await metric('retries_total')).toBe(1);
    });

    it('answers UNAVAILABLE with reason MODEL_NOT_READY when no worker has the version ready or can load it', async () => {
      workers[0]!.models.set(v('mlp', '1'), ModelState.READY);
      workers[1]!.models.set(v('mlp', '2'), ModelState.FAILED);
      const sut = await start();

      const error = await rpcRejection(sut.infer(rowsRequest('a', 1, 0, { modelVersion: '2' }), call()));

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(workers.flatMap((w) => w.received)).toHaveLength(0);
      // No worker has it and this test's registry watch holds no model: nothing says "mlp" is registered.
      expect(await metric('rejections_total', { model: '(unknown)', reason: 'MODEL_NOT_READY' })).toBe(1);
    });

    it('sends a version no worker has READY to a worker that loads it on demand (UNLOADED or LOADING)', async () => {
      workers[0]!.models.set(v('mlp', '2'), ModelState.FAILED);
      workers[1]!.models.set(v('mlp', '2'), ModelState.UNLOADED);
      workers[1]!.models.set(v('mlp', '3'), ModelState.LOADING);
      const sut = await start();

      await expect(sut.infer(rowsRequest('evicted', 1, 0, { modelVersion: '2' }), call())).resolves.toMatchObject({
        id: 'evicted',
      });
      await expect(sut.infer(rowsRequest('loading', 1, 0, { modelVersion: '3' }), call())).resolves.toMatchObject({
        id: 'loading',
      });
      expect(workers[1]!.received.map((r) => r.id)).toEqual(['evicted', 'loading']);
      expect(workers[0]!.received).toHaveLength(0);
    });

    it('finds a version that appeared on a worker after start without waiting for the poll interval', async () => {
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      const pollsAtStart = w2.listCalls;
      w2.models.set(v('mlp', '5'), ModelState.READY);

      await expect(sut.infer(rowsRequest('new', 1, 0, { modelVersion: '5' }), call())).resolves.toMatchObject({
        modelVersion: '5',
        id: 'new',
      });

      expect(w2.listCalls).toBe(pollsAtStart + 1);
      expect(w1.received).toHaveLength(0);
    });

    it('passes a worker error with a code through unchanged, without retrying it elsewhere', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      w1.failWith = RpcError.invalidArgument('input "x" has shape [3] but model "mlp" expects [4]', 'INVALID_TENSOR');

      const error = await rpcRejection(sut.infer(rowsRequest('bad', 1, 0), call()));

      expect([error.code, error.reason, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        'INVALID_TENSOR',
        'input "x" has shape [3] but model "mlp" expects [4]',
      ]);
      expect(w2.received).toHaveLength(0);
      expect(await metric('retries_total')).toBe(0);
    });

    it('refuses a request without a resolved version with INVALID_ARGUMENT', async () => {
      const sut = await start();

      const error = await rpcRejection(sut.infer(rowsRequest('a', 1, 0, { modelVersion: '' }), call()));

      expect(error.code).toBe(status.INVALID_ARGUMENT);
    });

    it('keeps serving with the last batching settings while the registry is down', async () => {
      workers[0]!.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxBatchSize: 0 });
      const sut = await start({ BATCHER_SETTINGS_TTL_MS: '1' });
      await sut.infer(rowsRequest('a', 1, 0), call());
      await registry.stop();
      await new Promise((r) => setTimeout(r, 20));

      await expect(sut.infer(rowsRequest('b', 1, 0), call())).resolves.toMatchObject({ id: 'b' });
      await expect(sut.infer(rowsRequest('c', 1, 0), call())).resolves.toMatchObject({ id: 'c' });
    });
  });

  describe('placement', () => {
    const notPlaced = (worker: string) =>
      new RpcError(status.FAILED_PRECONDITION, `model "mlp" is not placed on worker ${worker}`, {
        reason: 'MODEL_NOT_PLACED',
      });

    it('sends a version only to workers whose placement includes its model, READY or to load on demand, whatever the others list', async () => {
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      // w1 lists versions of "mlp" but says it serves only "other": its placement wins.
      w1.placement = ['other'];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w1.models.set(v('mlp', '2'), ModelState.UNLOADED);
      w1.models.set(v('mlp', '3'), ModelState.READY);
      w1.models.set(v('other', '1'), ModelState.READY);
      w2.placement = ['mlp'];
      w2.models.set(v('mlp', '1'), ModelState.UNLOADED);
      w2.models.set(v('mlp', '2'), ModelState.UNLOADED);
      const sut = await start();

      await expect(sut.infer(rowsRequest('ready-elsewhere', 1, 0), call())).resolves.toMatchObject({
        id: 'ready-elsewhere',
      });
      await expect(sut.infer(rowsRequest('on-demand', 1, 0, { modelVersion: '2' }), call())).resolves.toMatchObject({
        id: 'on-demand',
      });
      const error = await rpcRejection(sut.infer(rowsRequest('nowhere', 1, 0, { modelVersion: '3' }), call()));
      await expect(sut.infer(rowsRequest('other', 1, 0, { modelName: 'other' }), call())).resolves.toMatchObject({
        id: 'other',
      });

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(w1.received.map((r) => r.id)).toEqual(['other']);
      expect(w2.received.map((r) => r.id)).toEqual(['ready-elsewhere', 'on-demand']);
    });

    it('when the only worker placed for a model dies, answers its batch in flight and the requests queued behind it UNAVAILABLE at once; other models keep being served', async () => {
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      w1.placement = ['mlp'];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w2.placement = ['backup'];
      w2.models.set(v('backup', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const held = gate();
      w1.hold = held.promise;
      const inFlight = rpcRejection(sut.infer(rowsRequest('in-flight', 1, 0), call()));
      await eventually(() => w1.received.length === 1);
      const queued = ['q1', 'q2', 'q3'].map((id) => rpcRejection(sut.infer(rowsRequest(id, 1, 0), call())));
      await new Promise((r) => setTimeout(r, 20));
      expect(w1.received).toHaveLength(1);

      const killedAt = Date.now();
      await w1.stop();
      const errors = await Promise.all([inFlight, ...queued]);
      const tookMs = Date.now() - killedAt;
      held.open();

      expect(errors.map((e) => e.code)).toEqual(Array(4).fill(status.UNAVAILABLE));
      expect(errors.every((e) => e.message.includes('"mlp"'))).toBe(true);
      expect(tookMs).toBeLessThan(1_000);
      expect(w2.received).toHaveLength(0);
      const later = await rpcRejection(sut.infer(rowsRequest('later', 1, 0), call()));
      expect([later.code, later.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      await expect(sut.infer(rowsRequest('b', 1, 0, { modelName: 'backup' }), call())).resolves.toMatchObject({
        id: 'b',
        modelName: 'backup',
      });
    });

    it('sends a batch a worker refuses as not placed (FAILED_PRECONDITION, MODEL_NOT_PLACED) to another, then stops sending the model to it', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      w1.failWith = notPlaced('w1');

      await expect(sut.infer(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a' });
      await expect(sut.infer(rowsRequest('b', 1, 0), call())).resolves.toMatchObject({ id: 'b' });
      expect(w1.received.map((r) => r.id)).toEqual(['a']);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b']);
      expect(await metric('retries_total', { model: 'mlp' })).toBe(1);

      // Now the last worker that served it refuses it too: UNAVAILABLE, so that the router falls back.
      w2.failWith = notPlaced('w2');
      const error = await rpcRejection(sut.infer(rowsRequest('c', 1, 0), call()));
      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(error.message).toContain('no reachable worker serves model "mlp" version 1');
      expect(w1.received.map((r) => r.id)).toEqual(['a']);
    });
  });

  describe('batch assembly', () => {
    it('joins requests of mixed item counts into one batch and gives each its own rows back, in order', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1, 900);

      const sizes = [1, 3, 2, 1];
      const answers = Promise.all(sizes.map((rows, i) => sut.infer(rowsRequest(`r${i}`, rows, i * 100), call())));
      await new Promise((r) => setTimeout(r, 20));
      release();
      const responses = await answers;
      await blocker;

      expect(batchSizes(w1)).toEqual([1, 7]);
      responses.forEach((response, i) => {
        expect(response.id).toBe(`r${i}`);
        expect(response.outputs[0]!.shape).toEqual([BigInt(sizes[i]!), 2n]);
        expect(rowsOf(response)).toEqual(Array.from({ length: sizes[i]! }, (_, r) => i * 100 + r));
      });
      expect(await metric('batch_size', { model: 'mlp' })).toBeGreaterThan(0);
    });

    it('splits BYTES outputs by their elements', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const words = [
        ['a', 'bb'],
        ['ccc', '', 'dddd', 'e'],
      ];
      const bytesRequest = (id: string, elements: string[]) =>
        create(InferenceRequestSchema, {
          modelName: 'mlp',
          modelVersion: '1',
          id,
          inputs: [
            create(TensorSchema, {
              name: 'x',
              datatype: DataType.BYTES,
              shape: [BigInt(elements.length / 2), 2n],
              data: encodeBytesElements(elements.map((e) => Buffer.from(e))),
            }),
          ],
        });
      const answers = Promise.all(words.map((w, i) => sut.infer(bytesRequest(`s${i}`, w), call())));
      await new Promise((r) => setTimeout(r, 20));
      release();
      const responses = await answers;
      await blocker;

      expect(batchSizes(w1)).toEqual([1, 3]);
      responses.forEach((response, i) => {
        expect(decodeBytesElements(response.outputs[0]!.data)!.map(String)).toEqual(words[i]);
      });
    });

    it('never puts requests whose dimensions after the first differ into one batch', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const answers = Promise.all([
        sut.infer(rowsRequest('wide-1', 1, 10, {}, 4), call()),
        sut.infer(rowsRequest('narrow-1', 1, 20, {}, 2), call()),
        sut.infer(rowsRequest('wide-2', 2, 30, {}, 4), call()),
        sut.infer(rowsRequest('narrow-2', 1, 40, {}, 2), call()),
      ]);
      await new Promise((r) => setTimeout(r, 20));
      release();
      const responses = await answers;
      await blocker;

      expect(w1.received.slice(1).map((r) => r.inputs[0]!.shape.map(Number))).toEqual([
        [3, 4],
        [2, 2],
      ]);
      expect(responses.map(rowsOf)).toEqual([[10], [20], [30, 31], [40]]);
    });

    it('fails the requests of a batch whose output does not follow the batch dimension, without mixing values', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);
      w1.mangle = (response) => {
        const y = response.outputs[0]!;
        if (y.shape[0]! > 1n) y.shape = [1n, y.shape[0]! * y.shape[1]!];
      };

      const answers = [sut.infer(rowsRequest('a', 1, 0), call()), sut.infer(rowsRequest('b', 1, 1), call())].map((p) =>
        rpcRejection(p),
      );
      release();
      const errors = await Promise.all(answers);
      await blocker;

      for (const error of errors) {
        expect([error.code, error.reason]).toEqual([status.INTERNAL, 'BATCH_SPLIT_MISMATCH']);
        expect(error.message).toContain('output "y"');
      }
    });

    it('sends each request on its own when the version turns batching off (max_batch_size 0)', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxBatchSize: 0 });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const answers = Promise.all([1, 2, 1].map((rows, i) => sut.infer(rowsRequest(`r${i}`, rows, i), call())));
      await new Promise((r) => setTimeout(r, 20));
      release();
      await answers;
      await blocker;

      expect(batchSizes(w1)).toEqual([1, 1, 2, 1]);
    });
  });

  describe('batch timing', () => {
    it('does not wait for more requests while a worker is idle, however long the max queue delay', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 10_000_000n });
      const sut = await start();

      const started = Date.now();
      await sut.infer(rowsRequest('alone', 1, 0), call());

      expect(Date.now() - started).toBeLessThan(5_000);
      expect(batchSizes(w1)).toEqual([1]);
    });

    it('while every worker computes, waits up to the max queue delay for a batch to fill, then sends what it has', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 300_000n });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await occupy(sut, w1);

      // The worker has room for a second batch, but it computes: the batch waits for company.
      const early = sut.infer(rowsRequest('early', 1, 1), call());
      await new Promise((r) => setTimeout(r, 100));
      expect(w1.received).toHaveLength(1);
      const late = sut.infer(rowsRequest('late', 2, 2), call());
      await eventually(() => w1.received.length === 2, 2_000);
      release();
      await Promise.all([blocker, early, late]);

      expect(batchSizes(w1)).toEqual([1, 3]);
    });

    it('sends a full batch at once while every worker computes', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 10_000_000n, maxBatchSize: 4 });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await occupy(sut, w1);

      const answers = Promise.all([
        sut.infer(rowsRequest('a', 3, 1), call()),
        sut.infer(rowsRequest('b', 1, 2), call()),
      ]);
      await eventually(() => w1.received.length === 2, 2_000);
      release();
      await Promise.all([blocker, answers]);

      expect(batchSizes(w1)).toEqual([1, 4]);
    });

    it('sends the largest preferred batch size the queue can fill, and waits below the smallest one', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { preferredBatchSizes: [2, 4], maxQueueDelayUs: 200_000n });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      // Five single items queue behind the blocker: a batch of 4 (preferred), then 1 left over.
      const five = Promise.all([1, 2, 3, 4, 5].map((i) => sut.infer(rowsRequest(`r${i}`, 1, i), call())));
      await new Promise((r) => setTimeout(r, 20));
      release();
      await eventually(() => w1.received.length === 2);
      // The one left is below the smallest preferred size: it waits for the delay, with the worker idle.
      await new Promise((r) => setTimeout(r, 80));
      expect(w1.received).toHaveLength(2);
      await five;
      await blocker;

      expect(batchSizes(w1)).toEqual([1, 4, 1]);
    });
  });

  describe('priorities', () => {
    it('serves a higher priority level first and refuses a level the version does not have', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { priorityLevels: 3, defaultPriorityLevel: 2, maxBatchSize: 2 });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const answers = Promise.all([
        sut.infer(rowsRequest('low', 1, 1, { parameters: priority(3) }), call()),
        sut.infer(rowsRequest('default', 1, 2), call()),
        sut.infer(rowsRequest('high', 1, 3, { parameters: priority(1) }), call()),
        sut.infer(rowsRequest('default-0', 1, 4, { parameters: priority(0) }), call()),
      ]);
      await new Promise((r) => setTimeout(r, 20));
      release();
      await answers;
      await blocker;

      const order = w1.received
        .slice(1)
        .map((batch) => rowsOf({ outputs: [{ ...batch.inputs[0]!, name: 'y' }] } as InferenceResponse));
      expect(order).toEqual([
        [3, 2],
        [4, 1],
      ]);

      const error = await rpcRejection(sut.infer(rowsRequest('bad', 1, 0, { parameters: priority(4) }), call()));
      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(error.message).toContain('"priority"');
      expect(error.message).toContain('1 (highest) to 3');
    });
  });

  describe('bounded queue and deadlines', () => {
    it('refuses a request at once with RESOURCE_EXHAUSTED (QUEUE_FULL) and a retry delay when the queue is full', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.batching.set(v('mlp', '1'), { maxQueueSize: 2 });
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);
      const queued = [sut.infer(rowsRequest('q1', 1, 1), call()), sut.infer(rowsRequest('q2', 1, 2), call())];

      const started = Date.now();
      const error = await rpcRejection(sut.infer(rowsRequest('over', 1, 3), call()));

      expect(Date.now() - started).toBeLessThan(1_000);
      expect([error.code, error.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'QUEUE_FULL']);
      expect(error.message).toContain('(2 requests)');
      expect(error.retryDelayMs).toBeGreaterThan(0);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'QUEUE_FULL' })).toBe(1);
      expect(await metric('queue_depth', { model: 'mlp', version: '1' })).toBe(2);
      release();
      await Promise.all([blocker, ...queued]);
      expect(await metric('queue_depth', { model: 'mlp', version: '1' })).toBe(0);
    });

    it('answers DEADLINE_EXCEEDED when the deadline passes in the queue, and the request never reaches a worker', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const error = await rpcRejection(sut.infer(rowsRequest('late', 1, 1), call({ deadlineMs: Date.now() + 50 })));
      expect(await metric('queue_oldest_age_seconds', { model: 'mlp', version: '1' })).toBe(0);
      release();
      await blocker;
      await new Promise((r) => setTimeout(r, 20));

      expect([error.code, error.reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_EXCEEDED']);
      expect(error.message).toContain('in the queue');
      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
    });

    it('refuses at once a deadline that the queue ahead and the observed batch time cannot meet', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w1.delayMs = 100;
      const sut = await start();
      await sut.infer(rowsRequest('observed', 1, 0), call());

      const started = Date.now();
      const error = await rpcRejection(sut.infer(rowsRequest('hurried', 1, 1), call({ deadlineMs: Date.now() + 30 })));

      expect(Date.now() - started).toBeLessThan(30);
      expect([error.code, error.reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_INFEASIBLE']);
      expect(error.message).toMatch(/batch time of about \d/);
      expect(w1.received.map((r) => r.id)).toEqual(['observed']);
      // A deadline that leaves room is served.
      await expect(
        sut.infer(rowsRequest('relaxed', 1, 2), call({ deadlineMs: Date.now() + 5_000 })),
      ).resolves.toMatchObject({ id: 'relaxed' });
    });

    it('takes a cancelled request out of the queue: it never reaches a worker', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const cancel = new AbortController();
      const cancelled = rpcRejection(sut.infer(rowsRequest('cancelled', 1, 1), call({ signal: cancel.signal })));
      const kept = sut.infer(rowsRequest('kept', 1, 2), call());
      await new Promise((r) => setTimeout(r, 20));
      cancel.abort();
      expect((await cancelled).code).toBe(status.CANCELLED);
      release();
      await Promise.all([blocker, kept]);

      expect(w1.received.map((r) => r.id)).toEqual(['blocker', 'kept']);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(1);
    });

    it('counts a request cancelled once its deadline has passed as expired: the deadline cancelled it', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      // The server's own deadline timer cancels the call; it may fire before the batcher's.
      const cancel = new AbortController();
      const deadlineMs = Date.now() + 60;
      const expired = rpcRejection(
        sut.infer(rowsRequest('expired', 1, 1), call({ deadlineMs, signal: cancel.signal })),
      );
      await new Promise((r) => setTimeout(r, 20)); // queued
      // Past the deadline with the event loop held: the batcher's timer cannot have fired when the cancellation comes.
      while (Date.now() <= deadlineMs) {
        // busy
      }
      cancel.abort();
      expect([(await expired).code, (await expired).reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_EXCEEDED']);
      release();
      await blocker;

      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(0);
    });
    it('counts a request cancelled just before its deadline, as an upstream hop whose copy of it passed first cancels it, as expired', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await occupy(sut, w1);

      const upstream = new AbortController();
      const early = new AbortController();
      const deadlineMs = Date.now() + 2_000;
      const expired = rpcRejection(
        sut.infer(rowsRequest('expired', 1, 1), call({ deadlineMs, signal: upstream.signal })),
      );
      const cancelled = rpcRejection(
        sut.infer(rowsRequest('cancelled', 1, 2), call({ deadlineMs: Date.now() + 60_000, signal: early.signal })),
      );
      await new Promise((r) => setTimeout(r, 20)); // both queued
      early.abort(); // a minute before its deadline: the caller gave up
      // 50 ms before its deadline (within the skew the batcher allows): the deadline, seen first upstream.
      expect(CALLER_DEADLINE_SKEW_MS).toBeGreaterThan(50);
      while (deadlineMs - Date.now() > 50) await new Promise((r) => setTimeout(r, 5));
      upstream.abort();

      expect([(await expired).code, (await expired).reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_EXCEEDED']);
      expect((await cancelled).code).toBe(status.CANCELLED);
      release();
      await blocker;
      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
      expect(await metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(1);
    });
  });

  describe('ordering', () => {
    it('with preserve_ordering, answers a batch that finished early only after the batch formed before it', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = workers as [FakeWorker, FakeWorker];
      registry.batching.set(v('mlp', '1'), { preserveOrdering: true });
      const sut = await start();
      const held = gate();
      w1.hold = held.promise;
      const answered: string[] = [];
      const first = sut.infer(rowsRequest('first', 1, 0), call()).then(() => answered.push('first'));
      await eventually(() => w1.received.length === 1);
      const second = sut.infer(rowsRequest('second', 1, 1), call()).then(() => answered.push('second'));
      await eventually(() => w2.received.length === 1);
      await new Promise((r) => setTimeout(r, 30));

      expect(answered).toEqual([]);
      held.open();
      await Promise.all([first, second]);
      expect(answered).toEqual(['first', 'second']);
    });

    it('without it, answers each batch as soon as it finishes', async () => {
      for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1] = workers as [FakeWorker, FakeWorker];
      const sut = await start();
      const held = gate();
      w1.hold = held.promise;
      const first = sut.infer(rowsRequest('first', 1, 0), call());
      await eventually(() => w1.received.length === 1);

      await expect(sut.infer(rowsRequest('second', 1, 1), call())).resolves.toMatchObject({ id: 'second' });
      held.open();
      await first;
    });
  });

  describe('following the registry watch', () => {
    const mlp = (
      batching: MessageInitShape<typeof BatchingSchema>,
      states: VersionState[] = [VersionState.READY],
      unloaded = false,
    ) => ({
      name: 'models/mlp',
      unloaded,
      versions: states.map((state, i) => ({
        name: v('mlp', String(i + 1)),
        state,
        signature: { maxBatchSize: 8 },
        batching,
      })),
    });

    /** Starts the batcher and waits until its watch holds what the registry holds. */
    async function following(env: Record<string, string> = {}): Promise<Scheduler> {
      const sut = await start(env);
      await app!.get(RegistryWatch).ready();
      return sut;
    }

    async function applied(revision: bigint): Promise<void> {
      await eventually(() => app!.get(RegistryWatch).revision === revision);
    }

    it('applies new batching settings to the requests already waiting, without asking the registry', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.put(mlp({ maxQueueDelayUs: 10_000_000n, maxBatchSize: 4 }));
      const sut = await following({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await occupy(sut, w1);
      // The worker computes: the request waits up to 10 s for company.
      const waiting = sut.infer(rowsRequest('waiting', 1, 1), call());
      await new Promise((r) => setTimeout(r, 50));
      expect(w1.received).toHaveLength(1);

      registry.put(mlp({ maxQueueDelayUs: 0n, maxBatchSize: 4 }));

      await eventually(() => w1.received.length === 2, 2_000);
      release();
      await Promise.all([blocker, waiting]);
      expect(registry.resolveCalls).toBe(0);
    });

    it('serves a DRAINING version, refuses one that is not READY, an unknown one and those of an unloaded model', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w1.models.set(v('mlp', '2'), ModelState.READY);
      registry.put(mlp({}, [VersionState.DRAINING, VersionState.LOADING]));
      const sut = await following();

      await expect(sut.infer(rowsRequest('late', 1, 0), call())).resolves.toMatchObject({ id: 'late' });
      const loading = await rpcRejection(sut.infer(rowsRequest('early', 1, 0, { modelVersion: '2' }), call()));
      expect([loading.code, loading.reason, loading.message]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'version 2 of model "mlp" is LOADING, not READY',
      ]);
      const unknown = await rpcRejection(sut.infer(rowsRequest('unknown', 1, 0, { modelVersion: '9' }), call()));
      expect([unknown.code, unknown.reason, unknown.message]).toEqual([
        status.NOT_FOUND,
        'VERSION_NOT_FOUND',
        'model "mlp" has no version 9',
      ]);

      registry.put(mlp({}, [VersionState.DRAINING, VersionState.READY], true));
      await applied(2n);
      const unloaded = await rpcRejection(sut.infer(rowsRequest('unloaded', 1, 0), call()));
      expect([unloaded.code, unloaded.reason, unloaded.message]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'model "mlp" is unloaded',
      ]);
      expect(w1.received.map((r) => r.id)).toEqual(['late']);
      expect(registry.resolveCalls).toBe(0);
    });

    it('keeps serving with the settings it last saw while the registry is down, and says so in its health details', async () => {
      const [w1] = workers as [FakeWorker, FakeWorker];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      registry.put(mlp({ maxBatchSize: 0 }));
      const sut = await following({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });

      await registry.stop();
      await eventually(() => !app!.get(RegistryWatch).status().connected);
      const { blocker, release } = await occupy(sut, w1);
      const answers = Promise.all([1, 2].map((rows, i) => sut.infer(rowsRequest(`r${i}`, rows, i), call())));
      await new Promise((r) => setTimeout(r, 20));
      release();
      await Promise.all([blocker, answers]);

      // Batching off, as the watch last said: each request went on its own.
      expect(batchSizes(w1)).toEqual([1, 1, 2]);
      expect(registry.resolveCalls).toBe(0);
      expect(app!.get(HealthDetails).report()['registry']).toMatchObject({
        connected: false,
        serving_last_config: true,
        revision: 1,
      });
    });
  });
});
