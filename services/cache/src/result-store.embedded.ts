import { type Clock, systemClock } from '@infermesh/clock';
import { LRUCache } from 'lru-cache';
import { ResultStore } from './result-store';

/**
 * What an entry costs beyond its value's bytes and its key's characters: lru-cache's map entry and
 * slots for it, the Buffer object and its backing store's bookkeeping. Measured with
 * `node --expose-gc` on 20,000 entries of a 2,089-byte value (heap and array-buffer growth): 2,467
 * bytes an entry really held, 2,689 charged (2,089 + the key's 88 + 512).
 */
export const ENTRY_OVERHEAD_BYTES = 512;

/**
 * In-process store: an LRU cache (lru-cache) with a byte budget; the least recently used entries go
 * first when space is needed, and an expired entry is dropped when read or when its turn comes.
 *
 * The budget bounds the memory the process really holds: each value is kept in a buffer of its
 * exact size (a value that is a view into a larger buffer, such as a slice of Node's shared buffer
 * pool or of a received message, is copied, since the view would keep the whole buffer alive), and
 * each entry is charged its value, its key and a fixed overhead for its objects.
 */
export class EmbeddedResultStore extends ResultStore {
  private readonly entries: LRUCache<string, Buffer>;

  constructor(
    private readonly maxBytes: number,
    clock: Clock = systemClock,
  ) {
    super();
    this.entries = new LRUCache<string, Buffer>({
      maxSize: maxBytes,
      allowStale: false,
      updateAgeOnGet: false,
      ttlAutopurge: false,
      ttlResolution: 0,
      perf: { now: () => clock.now() },
    });
  }

  async get(key: Buffer): Promise<Buffer | undefined> {
    return this.entries.get(key.toString('base64'));
  }

  /** Replaces what is held under `key`; a value larger than the whole budget is not held. */
  async set(key: Buffer, value: Buffer, ttlMs: number): Promise<void> {
    const id = key.toString('base64');
    const bytes = value.byteLength + 2 * id.length + ENTRY_OVERHEAD_BYTES;
    if (bytes > this.maxBytes || !(ttlMs > 0)) {
      this.entries.delete(id); // (lru-cache would read a ttl of 0 as "forever")
      return;
    }
    this.entries.set(id, owned(value), { size: bytes, ttl: ttlMs });
  }

  /** The first 9 bytes of each key held (12 base64 characters). */
  override heldKeys(): Iterable<Buffer> | undefined {
    const ids = this.entries.keys();
    return (function* () {
      for (const id of ids) yield Buffer.from(id.slice(0, 12), 'base64');
    })();
  }

  /** Bytes charged to the entries held. */
  override get heldBytes(): number {
    return this.entries.calculatedSize;
  }

  async close(): Promise<void> {
    this.entries.clear();
  }
}

/** The value itself when it is the whole of its buffer, else a copy in a buffer of its own (never one from the shared pool). */
function owned(value: Buffer): Buffer {
  if (value.byteOffset === 0 && value.byteLength === value.buffer.byteLength) return value;
  const copy = Buffer.allocUnsafeSlow(value.byteLength);
  value.copy(copy);
  return copy;
}
