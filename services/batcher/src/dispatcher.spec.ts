import 'reflect-metadata';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { GrpcServer, RpcError, type ServiceImpl } from '@infermesh/grpc';
import { type InferenceRequest, InferenceRequestSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { loadBatcherConfig } from './batcher.config';
import { BatcherModule } from './batcher.module';
import { Dispatcher } from './dispatcher';
import { rpcRejection } from '@infermesh/testing';

// ---------------------------------------------------------------------------------------------
// Fake workers: the worker is another service, so these minimal WorkerService implementations stand
// in for it, served by the real GrpcServer over real sockets.
// ---------------------------------------------------------------------------------------------

const v = (model: string, version: string) => `models/${model}/versions/${version}`;

class FakeWorker {
  /** Resource name -> state reported by ListModels. */
  readonly models = new Map<string, ModelState>();
  readonly received: InferenceRequest[] = [];
  listCalls = 0;
  /** Thrown by Infer when set. */
  failWith: RpcError | undefined;
  /** While set, Infer waits for it before answering. */
  hold: Promise<void> | undefined;
  address = '';
  private server: GrpcServer | undefined;

  constructor(readonly id: string) {}

  async start(): Promise<this> {
    const impl: ServiceImpl<typeof WorkerService> = {
      listModels: async () => {
        this.listCalls += 1;
        return { workerId: this.id, models: [...this.models].map(([name, state]) => ({ name, state })) };
      },
      infer: async ({ request }) => {
        const req = request!;
        this.received.push(req);
        if (this.hold) await this.hold;
        if (this.failWith) throw this.failWith;
        return { response: { modelName: req.modelName, modelVersion: req.modelVersion, id: req.id } };
      },
      loadModel: () => Promise.reject(RpcError.invalidArgument('the batcher never loads models explicitly')),
      unloadModel: () => Promise.reject(RpcError.invalidArgument('the batcher never unloads models')),
    };
    this.server = new GrpcServer({ logger: new JsonLogger(this.id, 'error'), metrics: new Metrics('fake_worker'), maxMessageBytes: 1 << 20 });
    this.server.add(WorkerService, impl);
    this.address = `127.0.0.1:${await this.server.listen('127.0.0.1', 0)}`;
    return this;
  }

  async stop(): Promise<void> {
    await this.server?.shutdown(10);
    this.server = undefined;
  }
}

const inferRequest = (init: MessageInitShape<typeof InferenceRequestSchema> = {}): InferenceRequest =>
  create(InferenceRequestSchema, { modelName: 'mlp', modelVersion: '1', id: 'req', ...init });


async function eventually(condition: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe(Dispatcher.name, () => {
  let workers: FakeWorker[];
  let app: INestApplicationContext | undefined;

  /** Starts the batcher's Nest context against the fake workers; the periodic poll is an hour away. */
  async function start(): Promise<Dispatcher> {
    const config = loadBatcherConfig({
      BATCHER_LOG_LEVEL: 'error',
      BATCHER_WORKER_ADDRESSES: workers.map((w) => w.address).join(','),
      BATCHER_WORKER_POLL_MS: '3600000',
      BATCHER_WORKER_TIMEOUT_MS: '1000',
    });
    app = await NestFactory.createApplicationContext(BatcherModule.forRoot(config), { logger: false, abortOnError: false });
    return app.get(Dispatcher);
  }

  async function counter(name: string, labels: Record<string, string> = {}): Promise<number> {
    const metric = app!.get(Metrics).registry.getSingleMetric(`infermesh_batcher_${name}`);
    if (metric === undefined) throw new Error(`no metric ${name}`);
    const { values } = await metric.get();
    return values.filter((x) => Object.entries(labels).every(([k, l]) => x.labels[k] === l)).reduce((sum, x) => sum + x.value, 0);
  }

  beforeEach(async () => {
    workers = await Promise.all([new FakeWorker('w1').start(), new FakeWorker('w2').start()]);
  });

  afterEach(async () => {
    await app?.close();
    app = undefined;
    await Promise.all(workers.map((w) => w.stop()));
  });

  it('sends a request only to a worker that lists the version READY', async () => {
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    w1.models.set(v('mlp', '1'), ModelState.LOADING);
    w1.models.set(v('mlp', '2'), ModelState.READY);
    w2.models.set(v('mlp', '1'), ModelState.READY);
    w2.models.set(v('mlp', '2'), ModelState.FAILED);
    const sut = await start();

    for (const id of ['a', 'b', 'c']) {
      await expect(sut.infer(inferRequest({ id }))).resolves.toMatchObject({ modelVersion: '1', id });
    }
    await sut.infer(inferRequest({ modelVersion: '2', id: 'd' }));

    expect(w1.received.map((r) => r.id)).toEqual(['d']);
    expect(w2.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
  });

  it('sends a request to the worker with the least outstanding work', async () => {
    for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    let release!: () => void;
    w1.hold = new Promise((r) => (release = r));

    const first = sut.infer(inferRequest({ id: 'first' }));
    await eventually(() => w1.received.length === 1);
    await expect(sut.infer(inferRequest({ id: 'second' }))).resolves.toMatchObject({ id: 'second' });
    release();
    await expect(first).resolves.toMatchObject({ id: 'first' });

    expect(w1.received.map((r) => r.id)).toEqual(['first']);
    expect(w2.received.map((r) => r.id)).toEqual(['second']);
  });

  it('spreads requests that waited on the same poll over the workers by outstanding work', async () => {
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    for (const w of workers) {
      w.models.set(v('mlp', '4'), ModelState.READY);
      w.hold = hold;
    }

    // A burst for a version that became ready after the last poll: every request waits on one poll.
    const burst = Promise.all(['a', 'b', 'c', 'd'].map((id) => sut.infer(inferRequest({ modelVersion: '4', id }))));
    await eventually(() => w1.received.length + w2.received.length === 4);
    release();
    await burst;

    expect(w1.received).toHaveLength(2);
    expect(w2.received).toHaveLength(2);
  });

  it('retries once on another worker when one becomes unreachable, and skips it afterwards', async () => {
    for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    await w1.stop();

    await expect(sut.infer(inferRequest({ id: 'a' }))).resolves.toMatchObject({ id: 'a', modelVersion: '1' });
    expect(await counter('retries_total', { model: 'mlp' })).toBe(1);

    await expect(sut.infer(inferRequest({ id: 'b' }))).resolves.toMatchObject({ id: 'b' });
    expect(await counter('retries_total', { model: 'mlp' })).toBe(1);
    expect(w2.received.map((r) => r.id)).toEqual(['a', 'b']);
  });

  it('answers UNAVAILABLE when every worker holding the version is unreachable', async () => {
    for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
    const sut = await start();
    await Promise.all(workers.map((w) => w.stop()));

    const error = await rpcRejection(sut.infer(inferRequest()));

    expect(error.code).toBe(status.UNAVAILABLE);
    expect(error.message).toContain('"mlp"');
    expect(await counter('retries_total')).toBe(1);
  });

  it('answers UNAVAILABLE with reason MODEL_NOT_READY when no worker has the version ready or can load it', async () => {
    workers[0]!.models.set(v('mlp', '1'), ModelState.READY);
    workers[1]!.models.set(v('mlp', '2'), ModelState.FAILED);
    const sut = await start();

    const error = await rpcRejection(sut.infer(inferRequest({ modelVersion: '2' })));

    expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
    expect(error.message).toContain('"mlp"');
    expect(workers.flatMap((w) => w.received)).toHaveLength(0);
  });

  it('sends a version no worker has READY to a worker that loads it on demand (UNLOADED or LOADING)', async () => {
    workers[0]!.models.set(v('mlp', '2'), ModelState.FAILED);
    workers[1]!.models.set(v('mlp', '2'), ModelState.UNLOADED);
    workers[1]!.models.set(v('mlp', '3'), ModelState.LOADING);
    const sut = await start();

    await expect(sut.infer(inferRequest({ modelVersion: '2', id: 'evicted' }))).resolves.toMatchObject({ id: 'evicted' });
    await expect(sut.infer(inferRequest({ modelVersion: '3', id: 'loading' }))).resolves.toMatchObject({ id: 'loading' });
    expect(workers[1]!.received.map((r) => r.id)).toEqual(['evicted', 'loading']);
    expect(workers[0]!.received).toHaveLength(0);
  });

  it('finds a version that appeared on a worker after start without waiting for the poll interval', async () => {
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    const pollsAtStart = w2.listCalls;
    w2.models.set(v('mlp', '5'), ModelState.READY);

    await expect(sut.infer(inferRequest({ modelVersion: '5', id: 'new' }))).resolves.toMatchObject({ modelVersion: '5', id: 'new' });

    expect(w2.listCalls).toBe(pollsAtStart + 1);
    expect(w2.received.map((r) => r.id)).toEqual(['new']);
    expect(w1.received).toHaveLength(0);
  });

  it('passes a worker error with a code through unchanged, without retrying it elsewhere', async () => {
    for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    w1.failWith = RpcError.invalidArgument('input "x" has shape [3] but model "mlp" expects [4]', 'INVALID_TENSOR');

    const error = await rpcRejection(sut.infer(inferRequest({ id: 'bad' })));

    expect([error.code, error.reason, error.message]).toEqual([
      status.INVALID_ARGUMENT,
      'INVALID_TENSOR',
      'input "x" has shape [3] but model "mlp" expects [4]',
    ]);
    expect(w2.received).toHaveLength(0);
    expect(await counter('retries_total')).toBe(0);

    // The worker answered, so it keeps its versions: the next request goes to it again.
    w1.failWith = undefined;
    await sut.infer(inferRequest({ id: 'good' }));
    expect(w1.received.map((r) => r.id)).toEqual(['bad', 'good']);
  });

  it('retries a worker that refuses with UNAVAILABLE and a reason on another, but keeps the refusing worker', async () => {
    for (const w of workers) w.models.set(v('mlp', '1'), ModelState.READY);
    const [w1, w2] = workers as [FakeWorker, FakeWorker];
    const sut = await start();
    w1.failWith = RpcError.unavailable('the worker is shutting down', 'SHUTTING_DOWN');

    await expect(sut.infer(inferRequest({ id: 'a' }))).resolves.toMatchObject({ id: 'a' });
    expect(w2.received.map((r) => r.id)).toEqual(['a']);
    expect(await counter('retries_total')).toBe(1);

    w1.failWith = undefined;
    await sut.infer(inferRequest({ id: 'b' }));
    expect(w1.received.map((r) => r.id)).toEqual(['a', 'b']);
  });

  it('refuses a request without a resolved version with INVALID_ARGUMENT', async () => {
    const sut = await start();

    const error = await rpcRejection(sut.infer(inferRequest({ modelVersion: '' })));

    expect(error.code).toBe(status.INVALID_ARGUMENT);
  });
});
