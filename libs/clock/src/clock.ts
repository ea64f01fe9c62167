/** The longest delay a Node timer holds (2^31 - 1 ms, 24.8 days); a longer one would fire at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

export interface TimerOptions {
  /** The pending timer keeps the process alive, as a plain setTimeout does. */
  keepAlive?: boolean;
}

/**
 * Time and timers, injected wherever they decide behaviour (expiries, windows, cool-downs,
 * schedules), so that specs move time with a ManualClock instead of sleeping for it.
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
   * timer never keeps the process alive, unless `options.keepAlive` says it must (a supervisor's
   * restart, when its process has nothing else to wait for).
   */
  abstract setTimer(callback: () => void, delayMs: number, options?: TimerOptions): () => void;

  /** The wall clock as a Date. */
  date(): Date {
    return new Date(this.now());
  }

  /**
   * Calls `callback` every `periodMs` until cancelled (setInterval on this clock: each call arms the
   * next before it runs, so a callback that throws does not end the schedule); returns what cancels it.
   * A pending call never keeps the process alive.
   */
  setRepeatingTimer(callback: () => void, periodMs: number): () => void {
    let cancelled = false;
    let cancelNext = (): void => undefined;
    const arm = (): void => {
      cancelNext = this.setTimer(() => {
        if (cancelled) return;
        arm();
        callback();
      }, periodMs);
    };
    arm();
    return () => {
      cancelled = true;
      cancelNext();
    };
  }

  /**
   * Resolves after `delayMs` on this clock; rejects with the signal's reason (an AbortError unless
   * abort() was given one) as soon as `signal` aborts. The wait never keeps the process alive.
   */
  sleep(delayMs: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted === true) {
        reject(signal.reason as Error);
        return;
      }
      const onAbort = (): void => {
        cancel();
        reject(signal!.reason as Error);
      };
      const cancel = this.setTimer(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, delayMs);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** Date.now, performance.now and setTimeout (unref'd unless told to keep the process alive). */
export class SystemClock extends Clock {
  now(): number {
    return Date.now();
  }

  monotonic(): number {
    return performance.now();
  }

  setTimer(callback: () => void, delayMs: number, options?: TimerOptions): () => void {
    const timer = setTimeout(callback, Math.min(Math.max(0, delayMs), MAX_TIMER_MS));
    if (options?.keepAlive !== true) timer.unref();
    return () => clearTimeout(timer);
  }
}

/** The one system clock of a process. */
export const systemClock: Clock = new SystemClock();
