/** Where cached results live: bytes by key, with a time to live. */
export abstract class ResultStore {
  /** The stored bytes, or undefined when absent or expired. */
  abstract get(key: Buffer): Promise<Buffer | undefined>;
  abstract set(key: Buffer, value: Buffer, ttlMs: number): Promise<void>;
  /** Bytes of results this process holds and charges to its budget; undefined when they live elsewhere (Redis). */
  get heldBytes(): number | undefined {
    return undefined;
  }

  /**
   * The keys held, each as its first bytes at least (a KeyFilter's fingerprint); undefined when this
   * process cannot list them (they live in Redis, shared with other processes).
   */
  heldKeys(): Iterable<Buffer> | undefined {
    return undefined;
  }

  /** Releases connections. */
  abstract close(): Promise<void>;
}
