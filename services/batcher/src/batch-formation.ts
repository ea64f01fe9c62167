import type { BatchingPolicy } from './batching-policy';
import type { PendingRequest } from './pending-request';
import type { VersionQueue } from './version-queues';

/** The batch a version's queue would send now. */
export interface FormedBatch {
  /** Its requests, in the order they are served (by level, then arrival); the first is the queue's head. */
  readonly entries: PendingRequest[];
  /** Their items along the batch dimension. */
  readonly items: number;
  /**
   * Waiting cannot make it better: it has the max batch size or a preferred size, or a queued
   * request of its kind did not fit.
   */
  readonly full: boolean;
}

/**
 * The next batch of a non-empty queue: the head request and those after it (by level, then arrival)
 * that share its batch key, up to the max batch size, or up to the largest preferred size the queue
 * can fill, and with at most `maxBytes` of inputs (what one message to a worker can carry; the head
 * request goes whatever its size: it came in one message). A request that cannot join others goes alone.
 */
export function formBatch(queue: VersionQueue, maxBytes = Infinity): FormedBatch {
  const head = queue.head()!;
  const { maxBatchSize, preferredBatchSizes } = queue.policy;
  if (head.key === undefined || head.items >= maxBatchSize) return { entries: [head], items: head.items, full: true };
  let target = maxBatchSize;
  if (preferredBatchSizes.length > 0) {
    let available = 0;
    for (const entry of queue.inOrder()) {
      if (entry.key === head.key && available + entry.items <= maxBatchSize) available += entry.items;
      if (available === maxBatchSize) break;
    }
    target = preferredBatchSizes.filter((size) => size <= available).at(-1) ?? maxBatchSize;
  }
  const entries: PendingRequest[] = [];
  let items = 0;
  let bytes = 0;
  let overflow = false;
  for (const entry of queue.inOrder()) {
    if (entry.key !== head.key) continue;
    if (items + entry.items > target || (entries.length > 0 && bytes + entry.bytes > maxBytes)) {
      overflow = true;
      continue;
    }
    entries.push(entry);
    items += entry.items;
    bytes += entry.bytes;
    if (items === target) break;
  }
  return { entries, items, full: overflow || items >= maxBatchSize || preferredBatchSizes.includes(items) };
}

/**
 * How much longer a formed batch waits for more requests before it is cut, in whole ms; 0: send it
 * now. A batch goes at once while a worker is idle, with whatever the queue holds; it waits up to the
 * version's max queue delay (counted from its first request's arrival) while every worker already
 * computes, or while it is below the smallest preferred batch size. A full batch never waits.
 */
export function holdMs(batch: FormedBatch, policy: BatchingPolicy, workerIdle: boolean, firstWaitedMs: number): number {
  const { preferredBatchSizes, maxQueueDelayMs } = policy;
  const belowPreferred = preferredBatchSizes.length > 0 && batch.items < preferredBatchSizes[0]!;
  if (batch.full || (workerIdle && !belowPreferred)) return 0;
  const waitMs = maxQueueDelayMs - firstWaitedMs;
  return waitMs > 0 ? Math.ceil(waitMs) : 0;
}
