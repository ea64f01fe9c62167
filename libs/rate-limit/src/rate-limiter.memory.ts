import { type Clock, systemClock } from '@infermesh/clock';
import { type Bucket, type BucketState, type Decision, RateLimiter, takeTokens } from './rate-limiter';

/**
 * Token buckets in this process: the embedded store, and the fallback of one replica when Redis
 * cannot be reached. At most `maxBuckets` are kept; when full, buckets that have refilled completely
 * (indistinguishable from new ones) are dropped first, then the least recently used.
 */
export class MemoryRateLimiter extends RateLimiter {
  private readonly states = new Map<string, BucketState & { fullAtMs: number }>();

  constructor(
    private readonly maxBuckets = 100_000,
    private readonly clock: Clock = systemClock,
  ) {
    super();
  }

  async take(scope: string, buckets: readonly Bucket[]): Promise<Decision> {
    const nowMs = this.clock.now();
    const keys = buckets.map((b) => `${scope}\u0000${b.key}`);
    const { decision, states } = takeTokens(
      buckets,
      keys.map((key) => this.states.get(key)),
      nowMs,
    );
    buckets.forEach((bucket, i) => {
      const state = states[i]!;
      this.states.delete(keys[i]!); // re-inserted last: the map's order is least recently used first
      this.states.set(keys[i]!, {
        ...state,
        fullAtMs: nowMs + ((bucket.burst - state.tokens) * 1000) / bucket.ratePerS,
      });
    });
    if (this.states.size > this.maxBuckets) this.shrink(nowMs);
    return decision;
  }

  /** How many buckets are kept. */
  get size(): number {
    return this.states.size;
  }

  async close(): Promise<void> {
    this.states.clear();
  }

  private shrink(nowMs: number): void {
    for (const [key, state] of this.states) if (state.fullAtMs <= nowMs) this.states.delete(key);
    for (const key of this.states.keys()) {
      if (this.states.size <= this.maxBuckets) break;
      this.states.delete(key);
    }
  }
}
