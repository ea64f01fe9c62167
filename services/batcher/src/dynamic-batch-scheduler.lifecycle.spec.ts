import { status } from '@grpc/grpc-js';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { eventually, rpcRejection } from '@infermesh/testing';
import { CALLER_DEADLINE_SKEW_MS, DynamicBatchScheduler } from './dynamic-batch-scheduler';
import { BatcherHarness, call, gate, rowsRequest } from './testing/batcher-harness';
import { versionName as v } from './testing/fake-worker';

/** How a request the scheduler took leaves it: answered, expired, cancelled, or refused at shutdown. */
describe(DynamicBatchScheduler.name, () => {
  let h: BatcherHarness;

  beforeEach(async () => {
    h = await BatcherHarness.open();
    h.workers[0].models.set(v('mlp', '1'), ModelState.READY);
  });

  afterEach(async () => {
    await h.close();
  });

  describe('deadlines', () => {
    it('answers DEADLINE_EXCEEDED when the deadline passes in the queue, and the request never reaches a worker', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const late = rpcRejection(sut.enqueue(rowsRequest('late', 1, 1), call({ deadlineMs: h.clock.now() + 50 })));
      await h.inflight(2);
      h.clock.advance(49);
      expect(sut.inflightCount()).toBe(2);
      h.clock.advance(1);
      const error = await late;
      expect(sut.inflightCount()).toBe(1);
      release();
      await blocker;

      expect([error.code, error.reason, error.message]).toEqual([
        status.DEADLINE_EXCEEDED,
        'DEADLINE_EXCEEDED',
        `the request's deadline passed after 50 ms in the queue of model "mlp" version 1; it was not run`,
      ]);
      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
    });

    it('answers DEADLINE_EXCEEDED when the deadline passes while the batch runs, and cancels the batch nobody waits for', async () => {
      const [w1] = h.workers;
      const sut = await h.start();
      const held = gate();
      w1.hold = held.promise;

      const running = rpcRejection(sut.enqueue(rowsRequest('slow', 1, 1), call({ deadlineMs: h.clock.now() + 80 })));
      await eventually(() => w1.received.length === 1);
      h.clock.advance(80);
      const error = await running;

      expect([error.code, error.reason, error.message]).toEqual([
        status.DEADLINE_EXCEEDED,
        'DEADLINE_EXCEEDED',
        `the request's deadline passed after 80 ms, while its batch ran`,
      ]);
      // The worker call is cancelled while the worker still holds it: its slot is free again.
      await eventually(() => h.handleOf(w1).outstanding === 0);
      held.open();
      // It was not refused without reaching a worker.
      expect(await h.metric('rejections_total', { reason: 'DEADLINE_EXCEEDED' })).toBe(0);
    });
  });

  describe('cancellation', () => {
    it('takes a cancelled request out of the queue: it never reaches a worker', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const cancel = new AbortController();
      const cancelled = rpcRejection(sut.enqueue(rowsRequest('cancelled', 1, 1), call({ signal: cancel.signal })));
      const kept = sut.enqueue(rowsRequest('kept', 1, 2), call());
      await h.inflight(3);
      cancel.abort();
      const error = await cancelled;
      expect([error.code, error.message]).toEqual([status.CANCELLED, 'the call was cancelled']);
      release();
      await Promise.all([blocker, kept]);

      expect(w1.received.map((r) => r.id)).toEqual(['blocker', 'kept']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(1);
    });

    it('counts a request cancelled at its deadline, before its own timer fires, as expired: the deadline cancelled it', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      // The server's own deadline timer cancels the call; armed first, it fires before the batcher's.
      const cancel = new AbortController();
      h.clock.setTimer(() => cancel.abort(), 60);
      const expired = rpcRejection(
        sut.enqueue(rowsRequest('expired', 1, 1), call({ deadlineMs: h.clock.now() + 60, signal: cancel.signal })),
      );
      await h.inflight(2);
      h.clock.advance(60);
      const error = await expired;
      expect([error.code, error.reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_EXCEEDED']);
      release();
      await blocker;

      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(0);
    });

    it('counts a request cancelled within CALLER_DEADLINE_SKEW_MS of its deadline, as an upstream hop whose copy of it passed first cancels it, as expired', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const deadlineMs = h.clock.now() + 2_000;
      const [upstream, early, justBefore] = [new AbortController(), new AbortController(), new AbortController()];
      const expired = rpcRejection(
        sut.enqueue(rowsRequest('expired', 1, 1), call({ deadlineMs, signal: upstream.signal })),
      );
      const cancelled = rpcRejection(
        sut.enqueue(rowsRequest('early', 1, 2), call({ deadlineMs: h.clock.now() + 60_000, signal: early.signal })),
      );
      const outside = rpcRejection(
        sut.enqueue(rowsRequest('just-before', 1, 3), call({ deadlineMs: deadlineMs + 1, signal: justBefore.signal })),
      );
      await h.inflight(4);
      early.abort(); // a minute before its deadline: the caller gave up
      // CALLER_DEADLINE_SKEW_MS before the deadline: the deadline, seen first upstream; one ms earlier, the caller's choice.
      h.clock.advance(2_000 - CALLER_DEADLINE_SKEW_MS);
      upstream.abort();
      justBefore.abort();

      expect([(await expired).code, (await expired).reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_EXCEEDED']);
      expect((await cancelled).code).toBe(status.CANCELLED);
      expect((await outside).code).toBe(status.CANCELLED);
      release();
      await blocker;
      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_EXCEEDED' })).toBe(1);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(2);
    });
  });

  describe('in flight and shutdown', () => {
    it('counts the requests it holds, queued or on a worker, until each is answered', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      expect(sut.inflightCount()).toBe(0);
      const { blocker, release } = await h.occupy(w1);
      expect(sut.inflightCount()).toBe(1);
      const queued = [1, 2].map((i) => sut.enqueue(rowsRequest(`q${i}`, 1, i), call()));
      await h.inflight(3);

      release();
      await Promise.all([blocker, ...queued]);

      expect(sut.inflightCount()).toBe(0);
    });

    it('answers the queued requests UNAVAILABLE (SHUTTING_DOWN) when it stops; the batch on a worker finishes', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);
      const queued = [1, 2].map((i) => rpcRejection(sut.enqueue(rowsRequest(`q${i}`, 1, i), call())));
      await h.inflight(3);

      sut.stop();
      const errors = await Promise.all(queued);
      expect(sut.inflightCount()).toBe(1);
      release();

      for (const error of errors) {
        expect([error.code, error.reason, error.message]).toEqual([
          status.UNAVAILABLE,
          'SHUTTING_DOWN',
          'the batcher is shutting down',
        ]);
      }
      await expect(blocker).resolves.toMatchObject({ id: 'blocker' });
      expect(w1.received.map((r) => r.id)).toEqual(['blocker']);
    });
  });
});
