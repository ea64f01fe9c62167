import type { Counter } from 'prom-client';
import { type Bucket, type Decision, RateLimiter } from './rate-limiter';

/** What a replica does when the shared store cannot answer. */
export type StoreDownPolicy = 'local' | 'open' | 'closed';

export class RateLimitStoreUnavailableError extends Error {
  constructor(cause: unknown) {
    super(`the rate-limit store is unreachable: ${cause instanceof Error ? cause.message : String(cause)}`);
  }
}

/**
 * The shared limiter, and what applies while it cannot be reached: `local` limits with this
 * replica's own buckets (each replica then admits up to the full rate), `open` admits everything,
 * `closed` refuses with RateLimitStoreUnavailableError. Each fallback decision is counted.
 */
export class FallbackRateLimiter extends RateLimiter {
  constructor(
    private readonly shared: RateLimiter,
    private readonly local: RateLimiter,
    private readonly policy: StoreDownPolicy,
    private readonly fallbacks: Pick<Counter<'policy'>, 'inc'>,
    private readonly onFallback: (error: unknown) => void = () => undefined,
  ) {
    super();
  }

  async take(scope: string, buckets: readonly Bucket[]): Promise<Decision> {
    try {
      return await this.shared.take(scope, buckets);
    } catch (error) {
      this.fallbacks.inc({ policy: this.policy });
      this.onFallback(error);
      switch (this.policy) {
        case 'local':
          return this.local.take(scope, buckets);
        case 'open':
          return { allowed: true, retryAfterMs: 0 };
        case 'closed':
          throw new RateLimitStoreUnavailableError(error);
      }
    }
  }

  async close(): Promise<void> {
    await Promise.all([this.shared.close(), this.local.close()]);
  }
}
