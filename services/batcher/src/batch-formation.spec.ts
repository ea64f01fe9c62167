import type { BatchingPolicy } from './batching-policy';
import { type FormedBatch, formBatch, holdMs } from './batch-formation';
import { names, pending, policy } from './testing/pending-requests';
import { VersionQueue } from './version-queues';

/** A queue of "mlp" version 1 holding the given requests, in order. */
function queueOf(batching: Partial<BatchingPolicy>, ...entries: ReturnType<typeof pending>[]): VersionQueue {
  const queue = new VersionQueue('models/mlp/versions/1', 'mlp', '1', policy(batching));
  for (const entry of entries) queue.add(entry);
  return queue;
}

describe(formBatch.name, () => {
  it('takes the requests that share the head request’s batch key, in order, up to the max batch size', () => {
    const sut = formBatch;
    const queue = queueOf(
      { maxBatchSize: 4 },
      pending('a', { items: 1 }),
      pending('other', { items: 1, key: 'other' }),
      pending('b', { items: 2 }),
      pending('c', { items: 1 }),
      pending('d', { items: 1 }),
    );

    const batch = sut(queue);

    expect([names(batch.entries), batch.items, batch.full]).toEqual([['a', 'b', 'c'], 4, true]);
  });

  it('is not full while the queue holds less than the max batch size, and skips what would overflow it', () => {
    const sut = formBatch;

    const short = sut(queueOf({ maxBatchSize: 8 }, pending('a', { items: 2 }), pending('b', { items: 3 })));
    const overflowing = sut(queueOf({ maxBatchSize: 4 }, pending('a', { items: 3 }), pending('b', { items: 2 })));

    expect([names(short.entries), short.items, short.full]).toEqual([['a', 'b'], 5, false]);
    // Waiting cannot help a batch that a queued request of its kind did not fit.
    expect([names(overflowing.entries), overflowing.items, overflowing.full]).toEqual([['a'], 3, true]);
  });

  it('sends a request that cannot join others, or fills the max batch size alone, on its own', () => {
    const sut = formBatch;

    const alone = sut(queueOf({ maxBatchSize: 4 }, pending('a', { alone: true }), pending('b')));
    const large = sut(queueOf({ maxBatchSize: 4 }, pending('a', { items: 6 }), pending('b')));

    expect([names(alone.entries), alone.items, alone.full]).toEqual([['a'], 1, true]);
    expect([names(large.entries), large.items, large.full]).toEqual([['a'], 6, true]);
  });

  it('takes the largest preferred batch size the queue can fill, and is full at a preferred size', () => {
    const sut = formBatch;
    const five = () => ['a', 'b', 'c', 'd', 'e'].map((name) => pending(name));

    const preferred = sut(queueOf({ maxBatchSize: 8, preferredBatchSizes: [2, 4] }, ...five()));
    const between = sut(queueOf({ maxBatchSize: 8, preferredBatchSizes: [2, 4] }, ...five().slice(0, 3)));
    const below = sut(queueOf({ maxBatchSize: 8, preferredBatchSizes: [2, 4] }, pending('a')));

    expect([names(preferred.entries), preferred.items, preferred.full]).toEqual([['a', 'b', 'c', 'd'], 4, true]);
    expect([names(between.entries), between.items, between.full]).toEqual([['a', 'b'], 2, true]);
    // Below the smallest preferred size, it forms toward the max batch size.
    expect([below.items, below.full]).toEqual([1, false]);
  });

  it('keeps a batch within the bytes one message to a worker carries, and sends a larger request alone', () => {
    const sut = formBatch;
    const queue = () =>
      queueOf(
        { maxBatchSize: 8 },
        pending('a', { bytes: 16 }),
        pending('b', { bytes: 16 }),
        pending('huge', { bytes: 100 }),
        pending('c', { bytes: 16 }),
      );

    const bounded = sut(queue(), 40);
    const huge = sut(queueOf({ maxBatchSize: 8 }, pending('huge', { bytes: 100 }), pending('a', { bytes: 16 })), 40);

    expect([names(bounded.entries), bounded.items, bounded.full]).toEqual([['a', 'b'], 2, true]);
    expect([names(huge.entries), huge.full]).toEqual([['huge'], true]);
    expect(names(sut(queue()).entries)).toEqual(['a', 'b', 'huge', 'c']);
  });

  it('serves a higher priority level first, then arrival', () => {
    const sut = formBatch;
    const queue = queueOf(
      { maxBatchSize: 2, priorityLevels: 3 },
      pending('low', { level: 3 }),
      pending('mid', { level: 2 }),
      pending('high', { level: 1 }),
      pending('mid-2', { level: 2 }),
    );

    expect(names(sut(queue).entries)).toEqual(['high', 'mid']);
  });
});

describe(holdMs.name, () => {
  const batch = (items: number, full = false): FormedBatch => ({ entries: [pending('a', { items })], items, full });

  it('sends at once while a worker is idle, however long the max queue delay', () => {
    const sut = holdMs;

    expect(sut(batch(1), policy({ maxQueueDelayMs: 10_000 }), true, 0)).toBe(0);
  });

  it('while every worker computes, holds the batch until its first request has waited the max queue delay, in whole ms', () => {
    const sut = holdMs;
    const batching = policy({ maxQueueDelayMs: 300 });

    expect(sut(batch(1), batching, false, 0)).toBe(300);
    expect(sut(batch(1), batching, false, 100.5)).toBe(200);
    expect(sut(batch(1), batching, false, 299.9)).toBe(1);
    expect(sut(batch(1), batching, false, 300)).toBe(0);
    expect(sut(batch(1), batching, false, 450)).toBe(0);
  });

  it('never holds a full batch', () => {
    const sut = holdMs;

    expect(sut(batch(8, true), policy({ maxQueueDelayMs: 300 }), false, 0)).toBe(0);
  });

  it('holds a batch below the smallest preferred size even while a worker is idle', () => {
    const sut = holdMs;
    const batching = policy({ maxQueueDelayMs: 200, preferredBatchSizes: [2, 4] });

    expect(sut(batch(1), batching, true, 50)).toBe(150);
    expect(sut(batch(3), batching, true, 50)).toBe(0);
  });
});
