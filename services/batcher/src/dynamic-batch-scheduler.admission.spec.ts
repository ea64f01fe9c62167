import { status } from '@grpc/grpc-js';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { eventually, rpcRejection } from '@infermesh/testing';
import { DynamicBatchScheduler } from './dynamic-batch-scheduler';
import { Scheduler } from './scheduler';
import { BatcherHarness, call, gate, priority, rowsOf, rowsRequest } from './testing/batcher-harness';
import { versionName as v } from './testing/fake-worker';

describe(DynamicBatchScheduler.name, () => {
  let h: BatcherHarness;

  beforeEach(async () => {
    h = await BatcherHarness.open();
    h.workers[0].models.set(v('mlp', '1'), ModelState.READY);
  });

  afterEach(async () => {
    await h.close();
  });

  /** Runs one batch that takes `batchMs` on the batcher's clock, so that the version has an observed batch time. */
  async function observeBatchTime(batchMs: number): Promise<void> {
    const [w1] = h.workers;
    const held = gate();
    w1.hold = held.promise;
    const observed = h.get(Scheduler).enqueue(rowsRequest('observed', 1, 0), call());
    await eventually(() => w1.received.length === 1);
    h.clock.advance(batchMs);
    held.open();
    w1.hold = undefined;
    await observed;
  }

  describe('requests', () => {
    it('refuses a request without a resolved version with INVALID_ARGUMENT', async () => {
      const sut = await h.start();

      const error = await rpcRejection(sut.enqueue(rowsRequest('a', 1, 0, { modelVersion: '' }), call()));

      expect([error.code, error.reason, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        'INVALID_REQUEST',
        'the batcher needs a model name and a resolved version',
      ]);
    });

    it('refuses a call already cancelled, counting it, and sends nothing', async () => {
      const sut = await h.start();
      const cancel = new AbortController();
      cancel.abort();

      const error = await rpcRejection(sut.enqueue(rowsRequest('gone', 1, 0), call({ signal: cancel.signal })));

      expect(error.code).toBe(status.CANCELLED);
      expect(h.workers[0].received).toHaveLength(0);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'CANCELLED' })).toBe(1);
    });
  });

  describe('priorities', () => {
    it('serves a higher priority level first and refuses a level the version does not have', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { priorityLevels: 3, defaultPriorityLevel: 2, maxBatchSize: 2 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const answers = Promise.all([
        sut.enqueue(rowsRequest('low', 1, 1, { parameters: priority(3) }), call()),
        sut.enqueue(rowsRequest('default', 1, 2), call()),
        sut.enqueue(rowsRequest('high', 1, 3, { parameters: priority(1) }), call()),
        sut.enqueue(rowsRequest('default-0', 1, 4, { parameters: priority(0) }), call()),
      ]);
      await h.inflight(5);
      release();
      await answers;
      await blocker;

      const order = w1.received.slice(1).map((batch) => rowsOf({ outputs: [{ ...batch.inputs[0]!, name: 'y' }] }));
      expect(order).toEqual([
        [3, 2],
        [4, 1],
      ]);

      const error = await rpcRejection(sut.enqueue(rowsRequest('bad', 1, 0, { parameters: priority(4) }), call()));
      expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_PRIORITY']);
      expect(error.message).toBe(
        'parameter "priority" must be an integer from 1 (highest) to 3, or 0 for the default level 2, for model "mlp" version 1',
      );
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'INVALID_PRIORITY' })).toBe(1);
    });

    it('names the one level of a version without priority levels', async () => {
      const sut = await h.start();

      const error = await rpcRejection(sut.enqueue(rowsRequest('bad', 1, 0, { parameters: priority(2) }), call()));

      expect(error.message).toBe('parameter "priority" must be 0 or 1: model "mlp" version 1 has one priority level');
      expect(h.workers[0].received).toHaveLength(0);
    });
  });

  describe('bounded queue', () => {
    it('refuses a request at once with RESOURCE_EXHAUSTED (QUEUE_FULL) and a retry delay when the queue is full', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxQueueSize: 2 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);
      const queued = [sut.enqueue(rowsRequest('q1', 1, 1), call()), sut.enqueue(rowsRequest('q2', 1, 2), call())];
      await h.inflight(3);

      // The clock stands still: the refusal waits for nothing.
      const error = await rpcRejection(sut.enqueue(rowsRequest('over', 1, 3), call()));

      expect([error.code, error.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'QUEUE_FULL']);
      expect(error.message).toBe('the queue of model "mlp" version 1 is full (2 requests); retry later');
      // No batch of the version has run yet: a second.
      expect(error.retryDelayMs).toBe(1_000);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'QUEUE_FULL' })).toBe(1);
      expect(await h.metric('queue_depth', { model: 'mlp', version: '1' })).toBe(2);
      release();
      await Promise.all([blocker, ...queued]);
      expect(await h.metric('queue_depth', { model: 'mlp', version: '1' })).toBe(0);
      expect(w1.received.map((r) => r.id)).toEqual(['blocker', 'batch-1']);
    });

    it('asks a refused client to retry after the time the queue ahead needs, given the observed batch time', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxQueueSize: 2, maxBatchSize: 1 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      await observeBatchTime(250);
      const { blocker, release } = await h.occupy(w1);
      const queued = [sut.enqueue(rowsRequest('q1', 1, 1), call()), sut.enqueue(rowsRequest('q2', 1, 2), call())];
      await h.inflight(3);

      const error = await rpcRejection(sut.enqueue(rowsRequest('over', 1, 3), call()));

      // Two batches of one item ahead, on the one worker, at 250 ms each.
      expect(error.retryDelayMs).toBe(500);
      release();
      await Promise.all([blocker, ...queued]);
    });
  });

  describe('deadline feasibility', () => {
    it('refuses at once a deadline that the queue ahead and the observed batch time cannot meet', async () => {
      const [w1] = h.workers;
      const sut = await h.start();
      await observeBatchTime(100);

      const error = await rpcRejection(
        sut.enqueue(rowsRequest('hurried', 1, 1), call({ deadlineMs: h.clock.now() + 99 })),
      );

      expect([error.code, error.reason]).toEqual([status.DEADLINE_EXCEEDED, 'DEADLINE_INFEASIBLE']);
      expect(error.message).toBe(
        `model "mlp" version 1 cannot answer within the request's deadline: 99 ms are left, and the queue ahead of it and its batch time of about 100.0 ms need about 100 ms`,
      );
      expect(w1.received.map((r) => r.id)).toEqual(['observed']);
      expect(await h.metric('rejections_total', { model: 'mlp', reason: 'DEADLINE_INFEASIBLE' })).toBe(1);
      // A deadline that leaves the batch time is served.
      await expect(
        sut.enqueue(rowsRequest('relaxed', 1, 2), call({ deadlineMs: h.clock.now() + 100 })),
      ).resolves.toMatchObject({ id: 'relaxed' });
    });

    it('counts the items queued ahead at the same or a higher level, not those below', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxBatchSize: 2, priorityLevels: 2 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      await observeBatchTime(100);
      const { blocker, release } = await h.occupy(w1);
      // Four items of the lowest level wait: two batches of two.
      const low = [1, 2].map((i) => sut.enqueue(rowsRequest(`low${i}`, 2, i, { parameters: priority(2) }), call()));
      await h.inflight(3);

      // At the lowest level, its item goes in the third batch: 300 ms.
      const behind = await rpcRejection(
        sut.enqueue(
          rowsRequest('behind', 1, 3, { parameters: priority(2) }),
          call({ deadlineMs: h.clock.now() + 299 }),
        ),
      );
      expect(behind.reason).toBe('DEADLINE_INFEASIBLE');
      // At the highest level nothing is ahead of it: one batch, 100 ms.
      const ahead = sut.enqueue(
        rowsRequest('ahead', 1, 4, { parameters: priority(1) }),
        call({ deadlineMs: h.clock.now() + 100 }),
      );
      await h.inflight(4);
      release();
      await expect(ahead).resolves.toMatchObject({ id: 'ahead' });
      await Promise.all([blocker, ...low]);
      expect(w1.received.map((r) => r.id)).toEqual(['observed', 'blocker', 'ahead', 'low1', 'low2']);
    });
  });
});
