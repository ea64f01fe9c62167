import type { InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

/** What an entry is charged beyond its tensors' bytes: names, shapes, the map entry. */
const ENTRY_OVERHEAD_BYTES = 256;

interface Entry {
  response: InferenceResponse;
  bytes: number;
  expiresAt: number;
}

/**
 * The router's own small result cache in front of the shared cache service: answers a hot request
 * without a network hop. Entries are keyed like the shared cache (so they never cross versions or
 * tenants), live `ttlMs`, and the least recently used go first once the tensors held pass `maxBytes`.
 */
export class LocalResultCache {
  private readonly entries = new Map<string, Entry>();
  private bytes = 0;

  constructor(
    private readonly maxBytes: number,
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get(key: string): InferenceResponse | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    this.entries.delete(key);
    if (entry.expiresAt <= this.now()) {
      this.bytes -= entry.bytes;
      return undefined;
    }
    this.entries.set(key, entry); // the most recently used is last
    return entry.response;
  }

  /** Holds an answer for `ttlMs`, or this cache's own time when that is shorter or not given. */
  set(key: string, response: InferenceResponse, ttlMs = this.ttlMs): void {
    const bytes = response.outputs.reduce((n, t) => n + t.data.byteLength, ENTRY_OVERHEAD_BYTES);
    if (bytes > this.maxBytes) return;
    const previous = this.entries.get(key);
    if (previous !== undefined) {
      this.entries.delete(key);
      this.bytes -= previous.bytes;
    }
    this.entries.set(key, { response, bytes, expiresAt: this.now() + Math.min(ttlMs, this.ttlMs) });
    this.bytes += bytes;
    for (const [oldest, entry] of this.entries) {
      if (this.bytes <= this.maxBytes) break;
      this.entries.delete(oldest);
      this.bytes -= entry.bytes;
    }
  }

  /** Bytes charged to the entries held. */
  get size(): number {
    return this.bytes;
  }
}
