import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  DataType,
  InferenceRequestSchema,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { decodeBytesElements, encodeBytesElements } from '@infermesh/tensors';
import { eventually, rpcRejection } from '@infermesh/testing';
import { DynamicBatchScheduler } from './dynamic-batch-scheduler';
import { BatcherHarness, call, gate, rowsOf, rowsRequest } from './testing/batcher-harness';
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

  describe('batch assembly', () => {
    it('joins requests of mixed item counts into one batch and gives each its own rows back, in order', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1, 900);

      const sizes = [1, 3, 2, 1];
      const answers = Promise.all(sizes.map((rows, i) => sut.enqueue(rowsRequest(`r${i}`, rows, i * 100), call())));
      await h.inflight(5);
      release();
      const responses = await answers;
      await blocker;

      expect(w1.batchSizes()).toEqual([1, 7]);
      responses.forEach((response, i) => {
        expect(response.id).toBe(`r${i}`);
        expect(response.outputs[0]!.shape).toEqual([BigInt(sizes[i]!), 2n]);
        expect(rowsOf(response)).toEqual(Array.from({ length: sizes[i]! }, (_, r) => i * 100 + r));
      });
    });

    it('splits BYTES outputs by their elements', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

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
      const answers = Promise.all(words.map((w, i) => sut.enqueue(bytesRequest(`s${i}`, w), call())));
      await h.inflight(3);
      release();
      const responses = await answers;
      await blocker;

      expect(w1.batchSizes()).toEqual([1, 3]);
      responses.forEach((response, i) => {
        expect(decodeBytesElements(response.outputs[0]!.data)!.map(String)).toEqual(words[i]);
      });
    });

    it('never puts requests whose dimensions after the first differ into one batch', async () => {
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const answers = Promise.all([
        sut.enqueue(rowsRequest('wide-1', 1, 10, {}, 4), call()),
        sut.enqueue(rowsRequest('narrow-1', 1, 20, {}, 2), call()),
        sut.enqueue(rowsRequest('wide-2', 2, 30, {}, 4), call()),
        sut.enqueue(rowsRequest('narrow-2', 1, 40, {}, 2), call()),
      ]);
      await h.inflight(5);
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
      const [w1] = h.workers;
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);
      w1.mangle = (response) => {
        const y = response.outputs[0]!;
        if (y.shape[0]! > 1n) y.shape = [1n, y.shape[0]! * y.shape[1]!];
      };

      const answers = [sut.enqueue(rowsRequest('a', 1, 0), call()), sut.enqueue(rowsRequest('b', 1, 1), call())].map(
        (p) => rpcRejection(p),
      );
      await h.inflight(3);
      release();
      const errors = await Promise.all(answers);
      await blocker;

      expect(w1.batchSizes()).toEqual([1, 2]);
      for (const error of errors) {
        expect([error.code, error.reason]).toEqual([status.INTERNAL, 'BATCH_SPLIT_MISMATCH']);
        expect(error.message).toContain('output "y"');
      }
    });

    it('sends each request on its own when the version turns batching off (max_batch_size 0)', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxBatchSize: 0 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const { blocker, release } = await h.occupy(w1);

      const answers = Promise.all([1, 2, 1].map((rows, i) => sut.enqueue(rowsRequest(`r${i}`, rows, i), call())));
      await h.inflight(4);
      release();
      await answers;
      await blocker;

      expect(w1.batchSizes()).toEqual([1, 1, 2, 1]);
    });
  });

  describe('batch timing', () => {
    it('does not wait for more requests while a worker is idle, however long the max queue delay', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 10_000_000n });
      const sut = await h.start();

      // The clock stands still: a batch that waited for company would never be sent.
      const answer = sut.enqueue(rowsRequest('alone', 1, 0), call());
      await eventually(() => w1.received.length === 1);
      await expect(answer).resolves.toMatchObject({ id: 'alone' });

      expect(w1.batchSizes()).toEqual([1]);
    });

    it('while every worker computes, waits up to the max queue delay for a batch to fill, then sends what it has', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 300_000n });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await h.occupy(w1);

      // The worker has room for a second batch, but it computes: the batch waits for company.
      const early = sut.enqueue(rowsRequest('early', 1, 1), call());
      await h.inflight(2);
      h.clock.advance(100);
      const late = sut.enqueue(rowsRequest('late', 2, 2), call());
      await h.inflight(3);
      // 300 ms after the first request of the batch arrived, it goes with what it has.
      h.clock.advance(199);
      expect(h.handleOf(w1).outstanding).toBe(1);
      h.clock.advance(1);
      expect(h.handleOf(w1).outstanding).toBe(2);
      await eventually(() => w1.received.length === 2);
      release();
      await Promise.all([blocker, early, late]);

      expect(w1.batchSizes()).toEqual([1, 3]);
    });

    it('sends a full batch at once while every worker computes', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { maxQueueDelayUs: 10_000_000n, maxBatchSize: 4 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await h.occupy(w1);

      const answers = Promise.all([
        sut.enqueue(rowsRequest('a', 3, 1), call()),
        sut.enqueue(rowsRequest('b', 1, 2), call()),
      ]);
      await eventually(() => w1.received.length === 2);
      release();
      await Promise.all([blocker, answers]);

      expect(w1.batchSizes()).toEqual([1, 4]);
    });

    it('sends the largest preferred batch size the queue can fill, and waits below the smallest one', async () => {
      const [w1] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { preferredBatchSizes: [2, 4], maxQueueDelayUs: 200_000n });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
      const held = gate();
      w1.hold = held.promise;

      // A lone request is below the smallest preferred size: it waits the max queue delay, though the worker is idle.
      const blocker = sut.enqueue(rowsRequest('blocker', 1, 0), call());
      await h.inflight(1);
      h.clock.advance(199);
      expect(h.handleOf(w1).outstanding).toBe(0);
      h.clock.advance(1);
      expect(h.handleOf(w1).outstanding).toBe(1);
      await eventually(() => w1.received.length === 1);

      // Five single items queue behind it: a batch of 4 (preferred), then 1 left over.
      const answers = [1, 2, 3, 4, 5].map((i) => sut.enqueue(rowsRequest(`r${i}`, 1, i), call()));
      await h.inflight(6);
      held.open();
      w1.hold = undefined;
      await Promise.all([blocker, ...answers.slice(0, 4)]);
      expect(w1.batchSizes()).toEqual([1, 4]);
      // The one left waits for the delay again, with the worker idle.
      expect(h.handleOf(w1).outstanding).toBe(0);
      h.clock.advance(199);
      expect(h.handleOf(w1).outstanding).toBe(0);
      h.clock.advance(1);
      expect(h.handleOf(w1).outstanding).toBe(1);
      await answers[4];

      expect(w1.batchSizes()).toEqual([1, 4, 1]);
    });
  });

  describe('ordering', () => {
    beforeEach(() => h.workers[1].models.set(v('mlp', '1'), ModelState.READY));

    it('with preserve_ordering, answers a batch that finished early only after the batch formed before it', async () => {
      const [w1, w2] = h.workers;
      h.registry.batching.set(v('mlp', '1'), { preserveOrdering: true });
      const sut = await h.start();
      const held = gate();
      w1.hold = held.promise;
      const answered: string[] = [];
      const first = sut.enqueue(rowsRequest('first', 1, 0), call()).then(() => answered.push('first'));
      await eventually(() => w1.received.length === 1);
      const second = sut.enqueue(rowsRequest('second', 1, 1), call()).then(() => answered.push('second'));
      await eventually(() => w2.received.length === 1);
      // The second batch's worker has answered; its requests wait for the first batch's answers.
      await eventually(() => h.handleOf(w2).outstanding === 0);

      expect(answered).toEqual([]);
      held.open();
      await Promise.all([first, second]);
      expect(answered).toEqual(['first', 'second']);
    });

    it('without it, answers each batch as soon as it finishes', async () => {
      const [w1] = h.workers;
      const sut = await h.start();
      const held = gate();
      w1.hold = held.promise;
      const first = sut.enqueue(rowsRequest('first', 1, 0), call());
      await eventually(() => w1.received.length === 1);

      await expect(sut.enqueue(rowsRequest('second', 1, 1), call())).resolves.toMatchObject({ id: 'second' });
      held.open();
      await first;
    });
  });
});
