import { Injectable } from '@nestjs/common';
import type { BatchingPolicy } from './batching-policy';
import type { PendingRequest } from './pending-request';

/** The queue of one model version: a FIFO per priority level. */
export class VersionQueue {
  /** One FIFO per level (index 0 is level 1); Maps keep insertion order and delete in O(1). */
  private readonly levels: Map<number, PendingRequest>[] = [];
  /** Queued requests and their items, per level. */
  private readonly counts: { requests: number; items: number }[] = [];
  length = 0;
  /** Cancels the timer that forms the next batch once its oldest request has waited the max queue delay. */
  cancelBatchTimer: (() => void) | undefined;
  /** Exponentially weighted mean time of a batch on a worker, ms; undefined until one ran. */
  batchMs: number | undefined;
  /** The answers of the last formed batch: with preserve_ordering, the next batch answers after it. */
  delivered: Promise<void> = Promise.resolve();

  constructor(
    readonly name: string,
    readonly model: string,
    readonly version: string,
    public policy: BatchingPolicy,
  ) {
    this.resize(policy.priorityLevels);
  }

  /** Adopts a changed policy; requests keep their level, capped at the new lowest. */
  adopt(policy: BatchingPolicy): void {
    if (policy.priorityLevels !== this.policy.priorityLevels) this.resize(policy.priorityLevels);
    this.policy = policy;
  }

  add(entry: PendingRequest): void {
    this.levels[entry.level - 1]!.set(entry.id, entry);
    this.counts[entry.level - 1]!.requests += 1;
    this.counts[entry.level - 1]!.items += entry.items;
    this.length += 1;
    entry.queued = true;
  }

  remove(entry: PendingRequest): void {
    if (!entry.queued) return;
    entry.queued = false;
    this.levels[entry.level - 1]!.delete(entry.id);
    this.counts[entry.level - 1]!.requests -= 1;
    this.counts[entry.level - 1]!.items -= entry.items;
    this.length -= 1;
  }

  /** The next request to serve: the oldest of the highest level that has one. */
  head(): PendingRequest | undefined {
    for (const level of this.levels) {
      for (const entry of level.values()) return entry;
    }
    return undefined;
  }

  /** The request that has waited longest, whatever its level. */
  oldest(): PendingRequest | undefined {
    let oldest: PendingRequest | undefined;
    for (const level of this.levels) {
      for (const entry of level.values()) {
        if (oldest === undefined || entry.arrivedAtMs < oldest.arrivedAtMs) oldest = entry;
        break;
      }
    }
    return oldest;
  }

  /** Items queued at the given level or a higher one: the work served before a new request of that level. */
  itemsAhead(level: number): number {
    let items = 0;
    for (let i = 0; i < level; i++) items += this.counts[i]!.items;
    return items;
  }

  /** The queued requests in the order they are served: by level, then arrival. */
  *inOrder(): Generator<PendingRequest> {
    for (const level of this.levels) yield* level.values();
  }

  private resize(levels: number): void {
    const entries = [...this.inOrder()];
    this.levels.length = 0;
    this.counts.length = 0;
    for (let i = 0; i < levels; i++) {
      this.levels.push(new Map());
      this.counts.push({ requests: 0, items: 0 });
    }
    this.length = 0;
    for (const entry of entries) {
      entry.queued = false;
      entry.level = Math.min(entry.level, levels);
      this.add(entry);
    }
  }
}

/**
 * The queues of the model versions the batcher took requests for, one per version, made on its first
 * request. A queue stays when its version goes (its requests drain), so that its metrics do too.
 */
@Injectable()
export class VersionQueues implements Iterable<VersionQueue> {
  private readonly byName = new Map<string, VersionQueue>();
  /** The models that have a queue. */
  private readonly models = new Set<string>();

  /** The queue of `models/{model}/versions/{version}`, made if there is none; it adopts a changed policy. */
  open(name: string, model: string, version: string, policy: BatchingPolicy): VersionQueue {
    let queue = this.byName.get(name);
    if (queue === undefined) {
      queue = new VersionQueue(name, model, version, policy);
      this.byName.set(name, queue);
      this.models.add(model);
    } else if (queue.policy !== policy) {
      queue.adopt(policy);
    }
    return queue;
  }

  has(versionName: string): boolean {
    return this.byName.has(versionName);
  }

  hasModel(model: string): boolean {
    return this.models.has(model);
  }

  [Symbol.iterator](): Iterator<VersionQueue> {
    return this.byName.values();
  }
}
