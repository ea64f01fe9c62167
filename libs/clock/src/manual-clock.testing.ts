import { Clock } from './clock';

/**
 * For specs: time that moves only when the spec says so (advance), firing the timers that fall due
 * in order, each seeing the time it was due at. The wall clock starts at 2030-01-01T00:00:00Z unless
 * given; the monotonic clock at 0 and moves with it.
 *
 * It ships beside Clock (as fake clocks do in Go's benbjohnson/clock and clockwork) so that the specs
 * of every library can use it, those below libs/testing in the dependency graph (libs/grpc) included;
 * libs/testing exports it too. Production code never constructs one.
 */
export class ManualClock extends Clock {
  private wallMs: number;
  private elapsedMs = 0;
  private timers: { atMs: number; seq: number; callback: () => void }[] = [];
  private seq = 0;

  constructor(start: Date | number = Date.UTC(2030, 0, 1)) {
    super();
    this.wallMs = typeof start === 'number' ? start : start.getTime();
  }

  now(): number {
    return this.wallMs + this.elapsedMs;
  }

  monotonic(): number {
    return this.elapsedMs;
  }

  setTimer(callback: () => void, delayMs: number): () => void {
    const timer = { atMs: this.elapsedMs + Math.max(0, delayMs), seq: this.seq++, callback };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  /** When the pending timers fire, in ms from now, soonest first. */
  pendingInMs(): number[] {
    return this.timers.map((timer) => timer.atMs - this.elapsedMs).sort((a, b) => a - b);
  }

  /** Moves time on by `ms`, firing every timer due by then (those they set too) in order. */
  advance(ms: number): void {
    const until = this.elapsedMs + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.atMs <= until).sort((a, b) => a.atMs - b.atMs || a.seq - b.seq)[0];
      if (due === undefined) break;
      this.timers = this.timers.filter((t) => t !== due);
      this.elapsedMs = Math.max(this.elapsedMs, due.atMs);
      due.callback();
    }
    this.elapsedMs = until;
  }
}
