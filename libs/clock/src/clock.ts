/** The longest delay a Node timer holds (2^31 - 1 ms, 24.8 days); a longer one would fire at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Time and timers, injected wherever they decide behaviour (expiries, windows, cool-downs,
 * schedules), so that specs move time with libs/testing's ManualClock instead of sleeping for it.
 * Production code takes a Clock (systemClock by default) rather than reading Date.now,
 * performance.now or setTimeout itself.
 */
export abstract class Clock {
  /** Milliseconds since the Unix epoch: the wall clock, for what is stored or shown. */
  abstract now(): number;
  /** Milliseconds on a monotonic clock, for durations: it never goes back when the wall clock is set. */
  abstract monotonic(): number;
  /**
   * Calls `callback` once after `delayMs` (at most MAX_TIMER_MS); returns what cancels it. A pending
   * timer never keeps the process alive.
   */
  abstract setTimer(callback: () => void, delayMs: number): () => void;

  /** The wall clock as a Date. */
  date(): Date {
    return new Date(this.now());
  }
}

/** Date.now, performance.now and unref'd setTimeout. */
export class SystemClock extends Clock {
  now(): number {
    return Date.now();
  }

  monotonic(): number {
    return performance.now();
  }

  setTimer(callback: () => void, delayMs: number): () => void {
    const timer = setTimeout(callback, Math.min(Math.max(0, delayMs), MAX_TIMER_MS));
    timer.unref();
    return () => clearTimeout(timer);
  }
}

/** The one system clock of a process. */
export const systemClock: Clock = new SystemClock();
