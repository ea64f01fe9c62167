import type { Clock } from './clock';

interface Watched {
  /** When its timeout started (monotonic ms); undefined: it has not begun yet. */
  since: number | undefined;
  begun: (() => boolean) | undefined;
  onOverdue: (cause: OverdueCause) => void;
}

/** Why a watched thing was given up: its timeout passed, or it was the oldest when the sweep was full. */
export type OverdueCause = 'timeout' | 'evicted';

/**
 * Things that must end within a timeout of when they began (a request that must arrive whole, an
 * answer that must leave), watched by one repeating timer for all of them rather than a timer each:
 * it checks four times per timeout, so each is found overdue between 1 and 1.25 timeouts after it
 * began. The timer starts with the first thing watched and runs until close(). With `maxWatched`, at
 * most that many are watched: watching one more first gives up the one watched longest (`evicted`),
 * so that what a sweep holds stays bounded however fast things arrive that never end.
 */
export class OverdueSweep<K> {
  private readonly watched = new Map<K, Watched>();
  private stopTimer: (() => void) | undefined;

  constructor(
    private readonly clock: Clock,
    readonly timeoutMs: number,
    readonly maxWatched = Number.POSITIVE_INFINITY,
  ) {}

  /**
   * Watches `key` from now or, given `begun`, from the first check that finds it true; unless
   * forgotten first, `onOverdue` is called once a timeout later, and the key forgotten. Watching a
   * key again starts it over. At `maxWatched`, the key watched longest is forgotten first and its
   * `onOverdue` called with `evicted`.
   */
  watch(key: K, onOverdue: (cause: OverdueCause) => void, begun?: () => boolean): void {
    // Deleted first, so that a key watched again goes last in the order of eviction.
    if (!this.watched.delete(key) && this.watched.size >= this.maxWatched) this.evictOldest();
    this.watched.set(key, { since: begun === undefined ? this.clock.monotonic() : undefined, begun, onOverdue });
    this.stopTimer ??= this.clock.setRepeatingTimer(() => this.check(), Math.max(10, this.timeoutMs / 4));
  }

  /** Stops watching `key`: it ended in time, or went away. */
  forget(key: K): void {
    this.watched.delete(key);
  }

  /** How many things are watched. */
  get size(): number {
    return this.watched.size;
  }

  /** Stops the timer and forgets everything: nothing watched is called any more. */
  close(): void {
    this.stopTimer?.();
    this.stopTimer = undefined;
    this.watched.clear();
  }

  private evictOldest(): void {
    // A Map iterates in insertion order: its first key is the one watched longest.
    for (const [key, entry] of this.watched) {
      this.watched.delete(key);
      entry.onOverdue('evicted');
      return;
    }
  }

  private check(): void {
    const now = this.clock.monotonic();
    for (const [key, entry] of this.watched) {
      if (entry.since === undefined) {
        if (entry.begun!()) entry.since = now;
        continue;
      }
      if (now - entry.since < this.timeoutMs) continue;
      this.watched.delete(key);
      entry.onOverdue('timeout');
    }
  }
}
