import { create } from '@bufbuild/protobuf';
import type { Clock } from '@infermesh/clock';
import { type WatchKeysResponse, WatchKeysResponseSchema } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { FINGERPRINT_BYTES, KeyFilter } from '@infermesh/tensors';

/** How often the keys stored since go to the watchers, at most. */
export const KEY_DIGEST_INTERVAL_MS = 50;
/** The fewest keys a filter is sized for. */
export const MIN_FILTER_CAPACITY = 65_536;
/** Fingerprints waiting for one watcher, at most: beyond, it is sent the whole filter instead. */
const MAX_PENDING_FINGERPRINTS = 65_536;

/** One WatchKeys stream: what it has yet to be sent. */
class KeyWatcher {
  whole = true;
  added: Uint8Array[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  push(fingerprint: Uint8Array): void {
    if (this.whole) return;
    if (this.added.length >= MAX_PENDING_FINGERPRINTS) {
      this.whole = true;
      this.added = [];
    } else this.added.push(fingerprint);
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
    while (!this.whole && this.added.length === 0 && !this.ended) {
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
    return !this.ended;
  }
}

/**
 * Which keys this cache holds, as a Bloom filter (KeyFilter), for the routers that watch it
 * (CacheService.WatchKeys): they skip the lookup of a key the filter lacks. Every stored key is added;
 * keys that leave (evicted, expired, replaced) stay in the filter, which only makes routers ask for
 * them. Once as many keys were added as the filter was sized for, it is built again from the keys
 * held, sized for twice as many (at least MIN_FILTER_CAPACITY), and every watcher is sent it whole.
 */
export class HeldKeys {
  private filter: KeyFilter;
  private capacity = MIN_FILTER_CAPACITY;
  private added = 0;
  private readonly watchers = new Set<KeyWatcher>();
  private cancelFlush: (() => void) | undefined;

  constructor(
    /** The keys the store holds now. */
    private readonly held: () => Iterable<Buffer>,
    private readonly clock: Clock,
  ) {
    this.filter = KeyFilter.sized(this.capacity);
  }

  /** Filters built again since start. */
  rebuilds = 0;

  get watcherCount(): number {
    return this.watchers.size;
  }

  /** A key was stored. */
  stored(key: Buffer): void {
    if (++this.added > this.capacity) {
      this.rebuild();
      return;
    }
    this.filter.add(key);
    if (this.watchers.size === 0) return;
    const fingerprint = key.subarray(0, FINGERPRINT_BYTES);
    for (const watcher of this.watchers) watcher.push(fingerprint);
    this.cancelFlush ??= this.clock.setTimer(() => {
      this.cancelFlush = undefined;
      for (const watcher of this.watchers) watcher.wakeUp();
    }, KEY_DIGEST_INTERVAL_MS);
  }

  /** One watcher's stream: the whole filter, then the keys stored since, until `signal` aborts. */
  async *watch(signal: AbortSignal): AsyncGenerator<WatchKeysResponse> {
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
          watcher.added = [];
          // A copy: the filter changes while the message waits to be written.
          yield create(WatchKeysResponseSchema, {
            filter: { bits: this.filter.bits.slice(), hashes: this.filter.hashes },
          });
        } else {
          const added = Buffer.concat(watcher.added);
          watcher.added = [];
          yield create(WatchKeysResponseSchema, { added });
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
    this.capacity = Math.max(MIN_FILTER_CAPACITY, 2 * keys.length);
    this.filter = KeyFilter.sized(this.capacity);
    for (const key of keys) this.filter.add(key);
    this.added = keys.length;
    this.rebuilds++;
    for (const watcher of this.watchers) {
      watcher.whole = true;
      watcher.added = [];
      watcher.wakeUp();
    }
  }
}
