import { ResultStore } from './result-store';

/**
 * What an entry costs beyond its value's bytes and its key's characters: the map entry, the entry
 * object, the Buffer object and its backing store's bookkeeping. Measured with `node --expose-gc` on
 * 20,000 entries of a 2,089-byte value (heap and array-buffer growth): 2,467 bytes an entry really
 * held, 2,689 charged (2,089 + the key's 88 + 512).
 */
export const ENTRY_OVERHEAD_BYTES = 512;

interface Entry {
  value: Buffer;
  /** What the entry is charged: value, key and overhead. */
  bytes: number;
  expiresAt: number;
}

/**
 * In-process store: a Map kept in least-recently-used order with a byte budget; expired entries are
 * dropped when read or when space is needed.
 *
 * The budget bounds the memory the process really holds: each value is kept in a buffer of its
 * exact size (a value that is a view into a larger buffer, such as a slice of Node's shared buffer
 * pool or of a received message, is copied, since the view would keep the whole buffer alive), and
 * each entry is charged its value, its key and a fixed overhead for its objects.
 */
export class EmbeddedResultStore extends ResultStore {
  private readonly entries = new Map<string, Entry>();
  private bytes = 0;

  constructor(
    private readonly maxBytes: number,
    private readonly now: () => number = Date.now,
  ) {
    super();
  }

  async get(key: Buffer): Promise<Buffer | undefined> {
    const id = key.toString('base64');
    const entry = this.entries.get(id);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.delete(id, entry);
      return undefined;
    }
    this.entries.delete(id); // re-insert: most recently used last
    this.entries.set(id, entry);
    return entry.value;
  }

  async set(key: Buffer, value: Buffer, ttlMs: number): Promise<void> {
    const id = key.toString('base64');
    const previous = this.entries.get(id);
    if (previous !== undefined) this.delete(id, previous);
    const bytes = value.byteLength + 2 * id.length + ENTRY_OVERHEAD_BYTES;
    if (bytes > this.maxBytes) return;
    for (const [oldId, old] of this.entries) {
      if (this.bytes + bytes <= this.maxBytes) break;
      this.delete(oldId, old);
    }
    this.entries.set(id, { value: owned(value), bytes, expiresAt: this.now() + ttlMs });
    this.bytes += bytes;
  }

  /** Bytes charged to the entries held. */
  override get heldBytes(): number {
    return this.bytes;
  }

  async close(): Promise<void> {
    this.entries.clear();
    this.bytes = 0;
  }

  private delete(id: string, entry: Entry): void {
    this.entries.delete(id);
    this.bytes -= entry.bytes;
  }
}

/** The value itself when it is the whole of its buffer, else a copy in a buffer of its own (never one from the shared pool). */
function owned(value: Buffer): Buffer {
  if (value.byteOffset === 0 && value.byteLength === value.buffer.byteLength) return value;
  const copy = Buffer.allocUnsafeSlow(value.byteLength);
  value.copy(copy);
  return copy;
}
