import { status } from '@grpc/grpc-js';
import { Errors } from '@infermesh/grpc';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { eventually, rpcRejection } from '@infermesh/testing';
import { DynamicBatchScheduler } from './dynamic-batch-scheduler';
import { BatcherHarness, call, gate, rowsRequest } from './testing/batcher-harness';
import { versionName as v } from './testing/fake-worker';
import { WorkerPool } from './worker-pool';

/** A worker's own failure (INTERNAL): one its edge's outlier detection counts. */
const sessionFailed = () => Errors.internal('the session failed');

describe(DynamicBatchScheduler.name, () => {
  let h: BatcherHarness;

  beforeEach(async () => {
    h = await BatcherHarness.open();
  });

  afterEach(async () => {
    await h.close();
  });

  describe('worker choice', () => {
    it('sends a request only to a worker that lists the version READY', async () => {
      const [w1, w2] = h.workers;
      w1.models.set(v('mlp', '1'), ModelState.LOADING);
      w1.models.set(v('mlp', '2'), ModelState.READY);
      w2.models.set(v('mlp', '1'), ModelState.READY);
      w2.models.set(v('mlp', '2'), ModelState.FAILED);
      const sut = await h.start();

      for (const id of ['a', 'b', 'c']) {
        await expect(sut.enqueue(rowsRequest(id, 1, 0), call())).resolves.toMatchObject({ modelVersion: '1', id });
      }
      await sut.enqueue(rowsRequest('d', 1, 0, { modelVersion: '2' }), call());

      expect(w1.received.map((r) => r.id)).toEqual(['d']);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    });

    it('sends its batches to a worker carried on one stream (WorkerService/Infers), each served as an Infer call', async () => {
      const [w1] = h.workers;
      w1.placement = ['mlp'];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await h.start();

      for (const id of ['a', 'b', 'c']) {
        await expect(sut.enqueue(rowsRequest(id, 1, 0), call())).resolves.toMatchObject({ id });
      }
      // The stream is recorded when it ends: here, as the worker shuts down once it has answered.
      await w1.stop();

      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
      expect(await w1.handled('WorkerService/Infer')).toBe(3);
      expect(await w1.handled('WorkerService/Infers')).toBe(1);
    });

    it.each(['least_outstanding', 'power_of_two'])(
      'sends a batch to the worker with the fewest outstanding batches (%s: of two, both are compared)',
      async (choice) => {
        for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
        const [w1, w2] = h.workers;
        const sut = await h.start({ BATCHER_REPLICA_CHOICE: choice });
        const held = gate();
        w1.hold = held.promise;
        w2.hold = held.promise;

        // Both idle: the first batch may go to either; the second goes to the other, which has none.
        const first = sut.enqueue(rowsRequest('first', 1, 0), call());
        await eventually(() => w1.received.length + w2.received.length === 1);
        const second = sut.enqueue(rowsRequest('second', 1, 0), call());
        await eventually(() => w1.received.length + w2.received.length === 2);
        held.open();
        await expect(Promise.all([first, second])).resolves.toMatchObject([{ id: 'first' }, { id: 'second' }]);

        expect([w1.received.length, w2.received.length]).toEqual([1, 1]);
      },
    );

    it('keeps at most BATCHER_MAX_BATCHES_PER_WORKER batches on a worker; the queue waits for one to finish', async () => {
      const [w1] = h.workers;
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const held = gate();
      w1.hold = held.promise;

      const answers = Promise.all(['a', 'b', 'c'].map((id, i) => sut.enqueue(rowsRequest(id, 1, i), call())));
      await eventually(() => w1.received.length === 1);
      await h.inflight(3);
      // Well past the max queue delay (1 ms by default): the queue still waits for room on the worker.
      h.clock.advance(1_000);
      expect(h.handleOf(w1).outstanding).toBe(1);
      held.open();
      w1.hold = undefined;
      await answers;

      // The two that queued behind the first batch went together.
      expect(w1.batchSizes()).toEqual([1, 2]);
    });

    it('answers UNAVAILABLE with reason MODEL_NOT_READY when no worker has the version ready or can load it', async () => {
      h.workers[0].models.set(v('mlp', '1'), ModelState.READY);
      h.workers[1].models.set(v('mlp', '2'), ModelState.FAILED);
      const sut = await h.start();

      const error = await rpcRejection(sut.enqueue(rowsRequest('a', 1, 0, { modelVersion: '2' }), call()));

      expect([error.code, error.reason, error.message]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'no worker has model "mlp" version 2 ready',
      ]);
      expect(h.workers.flatMap((w) => w.received)).toHaveLength(0);
      // No worker has it and this test's registry watch holds no model: nothing says "mlp" is registered.
      expect(await h.metric('rejections_total', { model: '(unknown)', reason: 'MODEL_NOT_READY' })).toBe(1);
    });

    it('sends a version no worker has READY to a worker that loads it on demand (UNLOADED or LOADING)', async () => {
      h.workers[0].models.set(v('mlp', '2'), ModelState.FAILED);
      h.workers[1].models.set(v('mlp', '2'), ModelState.UNLOADED);
      h.workers[1].models.set(v('mlp', '3'), ModelState.LOADING);
      const sut = await h.start();

      await expect(sut.enqueue(rowsRequest('evicted', 1, 0, { modelVersion: '2' }), call())).resolves.toMatchObject({
        id: 'evicted',
      });
      await expect(sut.enqueue(rowsRequest('loading', 1, 0, { modelVersion: '3' }), call())).resolves.toMatchObject({
        id: 'loading',
      });
      expect(h.workers[1].received.map((r) => r.id)).toEqual(['evicted', 'loading']);
      expect(h.workers[0].received).toHaveLength(0);
    });

    it('finds a version that appeared on a worker after start without waiting for the poll interval', async () => {
      const [w1, w2] = h.workers;
      const sut = await h.start();
      const pollsAtStart = w2.listCalls;
      w2.models.set(v('mlp', '5'), ModelState.READY);

      await expect(sut.enqueue(rowsRequest('new', 1, 0, { modelVersion: '5' }), call())).resolves.toMatchObject({
        modelVersion: '5',
        id: 'new',
      });

      expect(w2.listCalls).toBe(pollsAtStart + 1);
      expect(w1.received).toHaveLength(0);
    });

    it('polls the workers every BATCHER_WORKER_POLL_MS on its clock', async () => {
      const [w1] = h.workers;
      await h.start({ BATCHER_WORKER_POLL_MS: '60000' });
      let polls = 0;
      h.get(WorkerPool).onPolled(() => (polls += 1));
      const listedAtStart = w1.listCalls;

      h.clock.advance(60_000);
      await eventually(() => polls === 1);
      h.clock.advance(60_000);
      await eventually(() => polls === 2);
      expect(w1.listCalls).toBe(listedAtStart + 2);
    });
  });

  describe('retries', () => {
    it('retries a batch once on another worker when its worker is unreachable, and skips that worker afterwards', async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      await w1.stop();

      await expect(sut.enqueue(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a', modelVersion: '1' });
      expect(await h.metric('retries_total', { model: 'mlp' })).toBe(1);

      await expect(sut.enqueue(rowsRequest('b', 1, 0), call())).resolves.toMatchObject({ id: 'b' });
      expect(await h.metric('retries_total', { model: 'mlp' })).toBe(1);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b']);
    });

    it('retries a worker that refuses with UNAVAILABLE and a reason on another, but keeps the refusing worker', async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      w1.failWith = Errors.shuttingDown('the worker is shutting down');

      await expect(sut.enqueue(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a' });
      expect(w2.received.map((r) => r.id)).toEqual(['a']);
      expect(await h.metric('retries_total')).toBe(1);

      w1.failWith = undefined;
      await sut.enqueue(rowsRequest('b', 1, 0), call());
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b']);
    });

    it("retries a batch as many times as the edge's policy says, on another worker each time, after the back-off", async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      h.get(WorkerPool).configureEdge({
        retry: { on: ['internal'], attempts: 3, backoff: { baseMs: 100, maxMs: 100 }, perTryTimeoutMs: undefined },
      });
      w1.failWith = sessionFailed();
      w2.failWith = sessionFailed();
      let settled = false;
      const answer = rpcRejection(sut.enqueue(rowsRequest('a', 1, 0), call())).finally(() => (settled = true));

      // Each retry waits its back-off (up to 100 ms, drawn at random) on the batcher's clock.
      await h.advanceUntil(() => settled, 20);
      const error = await answer;

      expect(error.code).toBe(status.INTERNAL);
      expect(w1.received.length + w2.received.length).toBe(3);
      expect(await h.metric('retries_total')).toBe(2);
    });

    it('passes a worker error with a code through unchanged, without retrying it elsewhere', async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      w1.failWith = Errors.invalidTensor('input "x" has shape [3] but model "mlp" expects [4]');

      const error = await rpcRejection(sut.enqueue(rowsRequest('bad', 1, 0), call()));

      expect([error.code, error.reason, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        'INVALID_TENSOR',
        'input "x" has shape [3] but model "mlp" expects [4]',
      ]);
      expect(w2.received).toHaveLength(0);
      expect(await h.metric('retries_total')).toBe(0);
    });

    it('answers every request of a batch UNAVAILABLE when every worker holding the version is unreachable', async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await h.start();
      await Promise.all(h.workers.map((w) => w.stop()));

      const error = await rpcRejection(sut.enqueue(rowsRequest('a', 1, 0), call()));

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'UPSTREAM_UNAVAILABLE']);
      expect(error.message).toContain('the worker for model "mlp" version 1 is unreachable');
      expect(await h.metric('retries_total')).toBe(1);
    });
  });

  describe('outlier ejection', () => {
    it("ejects a worker that fails as the edge's outlier detection says, and sends it nothing until the ejection ends", async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      const pool = h.get(WorkerPool);
      pool.configureEdge({
        retry: { on: ['unavailable'], attempts: 1, backoff: { baseMs: 0, maxMs: 0 }, perTryTimeoutMs: undefined },
        outlierDetection: {
          consecutiveFailures: 2,
          consecutiveGatewayFailures: 0,
          interval: 200,
          baseEjectionTime: 600,
          maxEjectionPercent: 50,
        },
      });
      w1.failWith = sessionFailed();
      w2.failWith = sessionFailed();

      // Two failures in a row on each (least outstanding: the first listed while both are idle); the
      // second worker is not ejected: 50 % of two are out already.
      for (const id of ['a', 'b', 'c', 'd']) await rpcRejection(sut.enqueue(rowsRequest(id, 1, 0), call()));
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b']);
      expect(w2.received.map((r) => r.id)).toEqual(['c', 'd']);
      expect(await h.metric('worker_ejections_total')).toBe(1);
      expect(await h.metric('workers_ejected')).toBe(1);
      w1.failWith = undefined;
      w2.failWith = undefined;
      for (const id of ['e', 'f', 'g']) await sut.enqueue(rowsRequest(id, 1, 0), call());
      expect(w1.received).toHaveLength(2);
      expect(w2.received.map((r) => r.id).slice(-3)).toEqual(['e', 'f', 'g']);

      // The ejection (600 ms) ends at the sweep (every 200 ms) that finds it up; then the worker takes batches again.
      h.clock.advance(599);
      expect(pool.available(v('mlp', '1'))).toHaveLength(1);
      h.clock.advance(1);
      expect(pool.available(v('mlp', '1'))).toHaveLength(2);
      expect(await h.metric('workers_ejected')).toBe(0);
      await sut.enqueue(rowsRequest('h', 1, 0), call());
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b', 'h']);
    });

    it('still sends to an ejected worker when every worker that holds the version is ejected (panic mode)', async () => {
      const [w1] = h.workers;
      w1.models.set(v('mlp', '1'), ModelState.READY);
      const sut = await h.start();
      h.get(WorkerPool).configureEdge({
        retry: { on: ['unavailable'], attempts: 1, backoff: { baseMs: 0, maxMs: 0 }, perTryTimeoutMs: undefined },
        outlierDetection: {
          consecutiveFailures: 2,
          consecutiveGatewayFailures: 0,
          interval: 60_000,
          baseEjectionTime: 60_000,
          maxEjectionPercent: 100,
        },
      });
      w1.failWith = sessionFailed();
      for (const id of ['a', 'b']) await rpcRejection(sut.enqueue(rowsRequest(id, 1, 0), call()));
      expect(await h.metric('workers_ejected')).toBe(1);
      w1.failWith = undefined;

      await expect(sut.enqueue(rowsRequest('c', 1, 0), call())).resolves.toMatchObject({ id: 'c' });
      expect(w1.received.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    });
  });

  describe('placement', () => {
    const notPlaced = (worker: string) => Errors.modelNotPlaced(`model "mlp" is not placed on worker ${worker}`);

    it('sends a version only to workers whose placement includes its model, READY or to load on demand, whatever the others list', async () => {
      const [w1, w2] = h.workers;
      // w1 lists versions of "mlp" but says it serves only "other": its placement wins.
      w1.placement = ['other'];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w1.models.set(v('mlp', '2'), ModelState.UNLOADED);
      w1.models.set(v('mlp', '3'), ModelState.READY);
      w1.models.set(v('other', '1'), ModelState.READY);
      w2.placement = ['mlp'];
      w2.models.set(v('mlp', '1'), ModelState.UNLOADED);
      w2.models.set(v('mlp', '2'), ModelState.UNLOADED);
      const sut = await h.start();

      await expect(sut.enqueue(rowsRequest('ready-elsewhere', 1, 0), call())).resolves.toMatchObject({
        id: 'ready-elsewhere',
      });
      await expect(sut.enqueue(rowsRequest('on-demand', 1, 0, { modelVersion: '2' }), call())).resolves.toMatchObject({
        id: 'on-demand',
      });
      const error = await rpcRejection(sut.enqueue(rowsRequest('nowhere', 1, 0, { modelVersion: '3' }), call()));
      await expect(sut.enqueue(rowsRequest('other', 1, 0, { modelName: 'other' }), call())).resolves.toMatchObject({
        id: 'other',
      });

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(w1.received.map((r) => r.id)).toEqual(['other']);
      expect(w2.received.map((r) => r.id)).toEqual(['ready-elsewhere', 'on-demand']);
    });

    it('when the only worker placed for a model dies, answers its batch in flight and the requests queued behind it UNAVAILABLE at once; other models keep being served', async () => {
      const [w1, w2] = h.workers;
      w1.placement = ['mlp'];
      w1.models.set(v('mlp', '1'), ModelState.READY);
      w2.placement = ['backup'];
      w2.models.set(v('backup', '1'), ModelState.READY);
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const held = gate();
      w1.hold = held.promise;
      const inFlight = rpcRejection(sut.enqueue(rowsRequest('in-flight', 1, 0), call()));
      await eventually(() => w1.received.length === 1);
      const queued = ['q1', 'q2', 'q3'].map((id) => rpcRejection(sut.enqueue(rowsRequest(id, 1, 0), call())));
      await h.inflight(4);
      expect(h.handleOf(w1).outstanding).toBe(1);

      // The clock stands still: the answers wait for no timer (no deadline, no poll interval).
      await w1.stop();
      const errors = await Promise.all([inFlight, ...queued]);
      held.open();

      expect(errors.map((e) => e.code)).toEqual(Array(4).fill(status.UNAVAILABLE));
      expect(errors.every((e) => e.message.includes('"mlp"'))).toBe(true);
      expect(errors.slice(1).map((e) => e.reason)).toEqual(Array(3).fill('MODEL_NOT_READY'));
      expect(w1.received).toHaveLength(1);
      expect(w2.received).toHaveLength(0);
      const later = await rpcRejection(sut.enqueue(rowsRequest('later', 1, 0), call()));
      expect([later.code, later.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      await expect(sut.enqueue(rowsRequest('b', 1, 0, { modelName: 'backup' }), call())).resolves.toMatchObject({
        id: 'b',
        modelName: 'backup',
      });
    });

    it('sends a batch a worker refuses as not placed (FAILED_PRECONDITION, MODEL_NOT_PLACED) to another, then stops sending the model to it', async () => {
      for (const w of h.workers) w.models.set(v('mlp', '1'), ModelState.READY);
      const [w1, w2] = h.workers;
      const sut = await h.start();
      w1.failWith = notPlaced('w1');

      await expect(sut.enqueue(rowsRequest('a', 1, 0), call())).resolves.toMatchObject({ id: 'a' });
      await expect(sut.enqueue(rowsRequest('b', 1, 0), call())).resolves.toMatchObject({ id: 'b' });
      expect(w1.received.map((r) => r.id)).toEqual(['a']);
      expect(w2.received.map((r) => r.id)).toEqual(['a', 'b']);
      expect(await h.metric('retries_total', { model: 'mlp' })).toBe(1);

      // Now the last worker that served it refuses it too: UNAVAILABLE, so that the router falls back.
      w2.failWith = notPlaced('w2');
      const error = await rpcRejection(sut.enqueue(rowsRequest('c', 1, 0), call()));
      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(error.message).toContain('no reachable worker serves model "mlp" version 1');
      expect(w1.received.map((r) => r.id)).toEqual(['a']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'MODEL_NOT_READY' })).toBe(1);
    });
  });
});
