/** One token bucket a request draws from: `burst` tokens at most, refilled at `ratePerS` per second. */
export interface Bucket {
  /** The bucket's identity within its scope, e.g. `all` or `model:<name>`. */
  key: string;
  ratePerS: number;
  burst: number;
}

export interface Decision {
  allowed: boolean;
  /** When refused: how long until every bucket holds a token again, in milliseconds. 0 when allowed. */
  retryAfterMs: number;
  /** When refused: the key of the bucket that refused (the one that refills last). */
  limitedBy?: string;
}

/**
 * Token buckets shared by every replica that uses the same store. A request takes one token from
 * each of its buckets, or from none when any of them is empty: a refused request costs nothing.
 * The buckets of one call belong to one scope (the caller, e.g. its tenant), which keeps them
 * together (one Redis Cluster slot).
 */
export abstract class RateLimiter {
  abstract take(scope: string, buckets: readonly Bucket[]): Promise<Decision>;
  abstract close(): Promise<void>;
}

/** Checks a bucket's settings once, where they are configured. */
export function checkBucket(bucket: Bucket): void {
  if (!(Number.isFinite(bucket.ratePerS) && bucket.ratePerS > 0))
    throw new RangeError(
      `rate of bucket ${bucket.key} must be a positive number of requests per second, got ${bucket.ratePerS}`,
    );
  if (!(Number.isFinite(bucket.burst) && bucket.burst >= 1))
    throw new RangeError(`burst of bucket ${bucket.key} must be at least 1, got ${bucket.burst}`);
}

export interface BucketState {
  tokens: number;
  updatedMs: number;
}

/**
 * The token-bucket arithmetic, shared by the in-memory limiter and mirrored by the Redis script:
 * refills each bucket for the time since it was last updated, then takes one token from each when
 * all have one. Mutates `states` (one per bucket, created full when undefined).
 */
export function takeTokens(
  buckets: readonly Bucket[],
  states: (BucketState | undefined)[],
  nowMs: number,
): { decision: Decision; states: BucketState[] } {
  const refilled = buckets.map((bucket, i) => {
    const state = states[i] ?? { tokens: bucket.burst, updatedMs: nowMs };
    const elapsedMs = Math.max(0, nowMs - state.updatedMs);
    return { tokens: Math.min(bucket.burst, state.tokens + (elapsedMs * bucket.ratePerS) / 1000), updatedMs: nowMs };
  });
  let retryAfterMs = 0;
  let limitedBy: string | undefined;
  buckets.forEach((bucket, i) => {
    const missing = 1 - refilled[i]!.tokens;
    if (missing > 0) {
      const waitMs = Math.ceil((missing * 1000) / bucket.ratePerS);
      if (waitMs >= retryAfterMs) {
        retryAfterMs = waitMs;
        limitedBy = bucket.key;
      }
    }
  });
  if (limitedBy !== undefined) return { decision: { allowed: false, retryAfterMs, limitedBy }, states: refilled };
  for (const state of refilled) state.tokens -= 1;
  return { decision: { allowed: true, retryAfterMs: 0 }, states: refilled };
}
