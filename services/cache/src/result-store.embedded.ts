import { ResultStore } from './result-store';

interface Entry {
  value: Buffer;
  expiresAt: number;
}

/**
 * In-process store: a Map kept in least-recently-used order with a byte budget; expired entries are
 * dropped when read or when space is needed.
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
    if (value.length > this.maxBytes) return;
    for (const [oldId, old] of this.entries) {
      if (this.bytes + value.length <= this.maxBytes) break;
      this.delete(oldId, old);
    }
    this.entries.set(id, { value, expiresAt: this.now() + ttlMs });
    this.bytes += value.length;
  }

  get sizeBytes(): number {
    return this.bytes;
  }

  async close(): Promise<void> {
    this.entries.clear();
    this.bytes = 0;
  }

  private delete(id: string, entry: Entry): void {
    this.entries.delete(id);
    this.bytes -= entry.value.length;
  }
}
