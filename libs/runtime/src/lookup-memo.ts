import { type Clock, systemClock } from '@infermesh/clock';
import { requestContext } from '@infermesh/telemetry';

export interface LookupMemoOptions {
  /** How long an answer is reused before it is looked up again; 0 looks up every time. */
  ttlMs: number;
  /**
   * When true, an answer past its time is still returned at once while a fresh one is looked up in
   * the background, and it stays when that lookup fails: the data plane keeps its last known
   * configuration while the control plane is away. When false, an expired answer is looked up again
   * before anything is returned, and a failed lookup fails the caller.
   */
  keepStale: boolean;
  /** Time: when answers expire (systemClock unless given). */
  clock?: Clock;
}

/**
 * Remembers the answers of an asynchronous lookup by key for a while. Concurrent lookups of one key
 * share one call, which runs outside the request that started it: that request's deadline or
 * cancellation must not fail it for the others, so the lookup bounds its own time.
 */
export class LookupMemo<V> {
  private readonly answers = new Map<string, { value: V; expiresAt: number }>();
  private readonly pending = new Map<string, Promise<V>>();
  private readonly clock: Clock;

  constructor(
    private readonly lookup: (key: string) => Promise<V>,
    private readonly options: LookupMemoOptions,
  ) {
    this.clock = options.clock ?? systemClock;
  }

  get(key: string): Promise<V> {
    const known = this.answers.get(key);
    if (known !== undefined) {
      if (known.expiresAt > this.clock.monotonic()) return Promise.resolve(known.value);
      if (this.options.keepStale) {
        this.refresh(key).catch(() => undefined);
        return Promise.resolve(known.value);
      }
    }
    return this.refresh(key);
  }

  /** Forgets every answer. */
  clear(): void {
    this.answers.clear();
  }

  private refresh(key: string): Promise<V> {
    const inFlight = this.pending.get(key);
    if (inFlight !== undefined) return inFlight;
    const call = requestContext
      .run({ requestId: requestContext.newRequestId() }, () => this.lookup(key))
      .then((value) => {
        if (this.options.ttlMs > 0 || this.options.keepStale)
          this.answers.set(key, { value, expiresAt: this.clock.monotonic() + this.options.ttlMs });
        return value;
      })
      .finally(() => this.pending.delete(key));
    this.pending.set(key, call);
    return call;
  }
}
