import { create } from '@bufbuild/protobuf';
import type { Clock } from '@infermesh/clock';
import { Errors } from '@infermesh/grpc';
import { type WatchKeysResponse, WatchKeysResponseSchema } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { FINGERPRINT_BYTES, KeyFilter } from '@infermesh/tensors';

/** How often the keys stored since go to the watchers, at most. */
export const KEY_DIGEST_INTERVAL_MS = 50;
/** The fewest and the most keys a filter is sized for: 80 KiB and 8 MiB of bits. */
export const FILTER_CAPACITY = { min: 65_536, max: 6_710_886 };
/** Fingerprints waiting for one watcher, at most (512 KiB): beyond, it is sent the whole filter instead. */
const MAX_PENDING_FINGERPRINTS = 65_536;
/** Open WatchKeys streams, at most: one a router, so many more would be a client misbehaving. */
export const MAX_KEY_WATCHERS = 1_024;

/** One WatchKeys stream: what it has yet to be sent. */
class KeyWatcher {
  /** The whole filter is to be sent next (the stream's first message, after a rebuild, or when it fell behind). */
  whole = true;
  /** The fingerprints stored since the last message, one after another in `pending`. */
  private pending = Buffer.allocUnsafe(64 * FINGERPRINT_BYTES);
  private count = 0;
  private wake: (() => void) | undefined;
  private ended = false;

  push(fingerprint: Uint8Array): void {
    if (this.whole) return;
    if (this.count >= MAX_PENDING_FINGERPRINTS) {
      this.sendWhole();
      return;
    }
    const at = this.count * FINGERPRINT_BYTES;
    if (at + FINGERPRINT_BYTES > this.pending.byteLength) {
      const larger = Buffer.allocUnsafe(2 * this.pending.byteLength);
      this.pending.copy(larger, 0, 0, at);
      this.pending = larger;
    }
    this.pending.set(fingerprint.subarray(0, FINGERPRINT_BYTES), at);
    this.count++;
  }

  /** The fingerprints waiting, in a buffer of their own; none wait after. */
  takeAdded(): Buffer {
    const added = Buffer.from(this.pending.subarray(0, this.count * FINGERPRINT_BYTES));
    this.count = 0;
    return added;
  }

  /** Sends the whole filter next, and nothing that waited. */
  sendWhole(): void {
    this.whole = true;
    this.count = 0;
  }

  wakeUp(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  end(): void {
    this.ended = true;
    this.wakeUp();
  }

  /** Resolves when there is something to send (true) or the stream ended (false). */
  async ready(): Promise<boolean> {
    while (!this.whole && this.count === 0 && !this.ended) {
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
    return !this.ended;
  }
}

/**
 * Which keys this cache holds, as a Bloom filter (KeyFilter), for the routers that watch it
 * (CacheService.WatchKeys): they skip the lookup of a key the filter lacks. Every stored key is added;
 * keys that leave (evicted, expired, replaced) stay in the filter, which only makes routers ask for
 * them. Once the filter holds as many keys as it was sized for (those it was built from and those
 * added since), it is built again from the keys held, sized for twice as many (within
 * FILTER_CAPACITY), and every watcher is sent it whole. Past the largest size it takes more absent keys
 * for present, and routers ask about them; it is built again after half its size more keys at least.
 */
export class HeldKeys {
  private filter: KeyFilter;
  private capacity: number;
  /** Keys added since the filter was built, and how many may be before it is built again. */
  private added = 0;
  private budget: number;
  private readonly watchers = new Set<KeyWatcher>();
  private cancelFlush: (() => void) | undefined;
  /** A copy of the filter's bits as they are, shared by the watchers sent it whole meanwhile. */
  private snapshot: Uint8Array | undefined;
  /** Filters built again since start. */
  rebuilds = 0;

  constructor(
    /** The keys the store holds now. */
    private readonly held: () => Iterable<Buffer>,
    private readonly clock: Clock,
    private readonly capacities = FILTER_CAPACITY,
    /** Called once the filter was built again. */
    private readonly onRebuild: () => void = () => undefined,
  ) {
    this.capacity = capacities.min;
    this.budget = this.capacity;
    this.filter = KeyFilter.sized(this.capacity);
  }

  get watcherCount(): number {
    return this.watchers.size;
  }

  /** A key was stored. */
  stored(key: Buffer): void {
    if (++this.added > this.budget) {
      this.rebuild();
      return;
    }
    this.filter.add(key);
    this.snapshot = undefined;
    if (this.watchers.size === 0) return;
    for (const watcher of this.watchers) watcher.push(key);
    this.cancelFlush ??= this.clock.setTimer(() => {
      this.cancelFlush = undefined;
      for (const watcher of this.watchers) watcher.wakeUp();
    }, KEY_DIGEST_INTERVAL_MS);
  }

  /** One watcher's stream: the whole filter, then the keys stored since, until `signal` aborts. */
  async *watch(signal: AbortSignal): AsyncGenerator<WatchKeysResponse> {
    if (this.watchers.size >= MAX_KEY_WATCHERS) {
      throw Errors.overloaded(
        `this cache already tells ${this.watchers.size} watchers its keys, the most it will (one a router); look each key up`,
      );
    }
    const watcher = new KeyWatcher();
    this.watchers.add(watcher);
    const leave = () => {
      this.watchers.delete(watcher);
      watcher.end();
    };
    signal.addEventListener('abort', leave, { once: true });
    try {
      while (await watcher.ready()) {
        if (watcher.whole) {
          watcher.whole = false;
          // A copy, since the filter changes while the message waits to be written; the watchers
          // woken together by a rebuild share one.
          this.snapshot ??= this.filter.bits.slice();
          yield create(WatchKeysResponseSchema, { filter: { bits: this.snapshot, hashes: this.filter.hashes } });
        } else {
          yield create(WatchKeysResponseSchema, { added: watcher.takeAdded() });
        }
      }
    } finally {
      signal.removeEventListener('abort', leave);
      leave();
    }
  }

  /** Ends every stream. */
  close(): void {
    this.cancelFlush?.();
    for (const watcher of this.watchers) watcher.end();
    this.watchers.clear();
  }

  private rebuild(): void {
    const keys = [...this.held()];
    this.capacity = Math.min(this.capacities.max, Math.max(this.capacities.min, 2 * keys.length));
    this.filter = KeyFilter.sized(this.capacity);
    for (const key of keys) this.filter.add(key);
    this.snapshot = undefined;
    this.added = 0;
    // Built again once full; at least after half its size more keys, however many are held.
    this.budget = Math.max(this.capacity - keys.length, this.capacity / 2);
    this.rebuilds++;
    this.onRebuild();
    for (const watcher of this.watchers) {
      watcher.sendWhole();
      watcher.wakeUp();
    }
  }
}
