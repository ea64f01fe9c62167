import type { Clock } from './clock';

interface Watched {
  /** When its timeout started (monotonic ms); undefined: it has not begun yet. */
  since: number | undefined;
  begun: (() => boolean) | undefined;
  onOverdue: () => void;
}

/**
 * Things that must end within a timeout of when they began (a request that must arrive whole, an
 * answer that must leave), watched by one repeating timer for all of them rather than a timer each:
 * it checks four times per timeout, so each is found overdue between 1 and 1.25 timeouts after it
 * began. The timer starts with the first thing watched and runs until close().
 */
export class OverdueSweep<K> {
  private readonly watched = new Map<K, Watched>();
  private stopTimer: (() => void) | undefined;

  constructor(
    private readonly clock: Clock,
    readonly timeoutMs: number,
  ) {}

  /**
   * Watches `key` from now or, given `begun`, from the first check that finds it true; unless
   * forgotten first, `onOverdue` is called once a timeout later, and the key forgotten. Watching a
   * key again starts it over.
   */
  watch(key: K, onOverdue: () => void, begun?: () => boolean): void {
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

  private check(): void {
    const now = this.clock.monotonic();
    for (const [key, entry] of this.watched) {
      if (entry.since === undefined) {
        if (entry.begun!()) entry.since = now;
        continue;
      }
      if (now - entry.since < this.timeoutMs) continue;
      this.watched.delete(key);
      entry.onOverdue();
    }
  }
}
