import { ManualClock } from '@infermesh/testing';
import { ConcurrencyLimit } from './concurrency-limit';

/**
 * An upstream simulated in 1 ms steps: it answers up to `knee` requests at once in `baseMs` (a
 * batching model: batch delay and compute), and one more every `1000 / perSecond` ms beyond them,
 * in order (a queue). `offeredPerMs` requests arrive each step, whatever the answers. Requests in
 * flight at the end of one run are answered in the next.
 */
interface Load {
  knee: number;
  baseMs: number;
  perSecond: number;
  offeredPerMs: number;
  ms: number;
}

class Upstream {
  private readonly inFlight: { done: number; admitted: number; start: number }[] = [];
  private queueFreeAt = 0;

  constructor(
    private readonly limit: ConcurrencyLimit,
    private readonly clock: ManualClock,
  ) {}

  run(o: Load) {
    let answered = 0;
    let refused = 0;
    const latencies: number[] = [];
    const end = this.clock.monotonic() + o.ms;
    for (; this.clock.monotonic() < end; this.clock.advance(1)) {
      const t = this.clock.monotonic();
      for (let i = 0; i < o.offeredPerMs; i++) {
        const admitted = this.limit.tryAcquire();
        if (admitted === undefined) {
          refused += 1;
          continue;
        }
        let done = t + o.baseMs;
        if (this.inFlight.length >= o.knee) {
          this.queueFreeAt = Math.max(this.queueFreeAt, t) + 1000 / o.perSecond;
          done = Math.max(done, this.queueFreeAt);
        }
        this.inFlight.push({ done, admitted, start: t });
      }
      for (let i = this.inFlight.length - 1; i >= 0; i--) {
        const r = this.inFlight[i]!;
        if (r.done > t) continue;
        this.inFlight.splice(i, 1);
        this.limit.release(r.admitted, t - r.start);
        latencies.push(t - r.start);
        answered += 1;
      }
    }
    latencies.sort((a, b) => a - b);
    return {
      answered,
      refused,
      p50: latencies[Math.floor(latencies.length / 2)] ?? NaN,
      p99: latencies[Math.floor(latencies.length * 0.99)] ?? NaN,
    };
  }
}

describe(ConcurrencyLimit.name, () => {
  let clock: ManualClock;
  beforeEach(() => (clock = new ManualClock()));
  const adaptive = (o: Partial<ConstructorParameters<typeof ConcurrencyLimit>[0]> = {}) =>
    new ConcurrencyLimit({ min: 4, max: 1024, adaptive: true, clock, ...o });

  it('fixed: admits up to max and refuses beyond, whatever the latency', () => {
    const limit = new ConcurrencyLimit({ min: 1, max: 3, adaptive: false, clock });
    const admitted = [limit.tryAcquire(), limit.tryAcquire(), limit.tryAcquire()];
    expect(admitted.every((a) => a !== undefined)).toBe(true);
    expect(limit.tryAcquire()).toBeUndefined();
    for (let i = 0; i < 100; i++) {
      clock.advance(10);
      limit.release(admitted[0]!, 10_000);
      limit.tryAcquire();
    }
    expect(limit.limit).toBe(3);
    limit.release(admitted[1]!);
    expect(limit.inFlight).toBe(2);
    expect(limit.tryAcquire()).toBeDefined();
  });

  it('refuses bounds that cannot hold', () => {
    expect(() => new ConcurrencyLimit({ min: 0, max: 3, adaptive: true })).toThrow(/1 <= min <= max/);
    expect(() => new ConcurrencyLimit({ min: 5, max: 3, adaptive: true })).toThrow(/got min 5, max 3/);
  });

  it('starts at 128 within its bounds', () => {
    expect(adaptive().limit).toBe(128);
    expect(adaptive({ max: 50 }).limit).toBe(50);
    expect(adaptive({ min: 200, max: 300 }).limit).toBe(200);
  });

  it('does not move while the requests stay under half of it, however slow they become', () => {
    const limit = adaptive();
    const upstream = new Upstream(limit, clock);
    const fast = upstream.run({ knee: 10_000, baseMs: 5, perSecond: 1_000, offeredPerMs: 1, ms: 2_000 });
    const slow = upstream.run({ knee: 10_000, baseMs: 60, perSecond: 1_000, offeredPerMs: 1, ms: 3_000 });
    expect(limit.limit).toBe(128);
    expect(fast.refused + slow.refused).toBe(0);
  });

  it('grows while the upstream takes more at the same latency, up to what is offered', () => {
    const limit = adaptive();
    const upstream = new Upstream(limit, clock);
    // 3 requests a ms at 100 ms: 300 in flight, the upstream has room for 10,000.
    const result = upstream.run({ knee: 10_000, baseMs: 100, perSecond: 1_000, offeredPerMs: 3, ms: 10_000 });
    expect(limit.limit).toBeGreaterThanOrEqual(300);
    const later = upstream.run({ knee: 10_000, baseMs: 100, perSecond: 1_000, offeredPerMs: 3, ms: 2_000 });
    expect(later.refused).toBe(0);
    expect(result.answered).toBeGreaterThan(0);
  });

  it("under sustained overload comes down to the upstream's knee and stays there: no drift towards max", () => {
    const limit = adaptive({ max: 2_048 });
    const upstream = new Upstream(limit, clock);
    // The knee is at 100 in flight (100 ms each, 1,000/s); 3,000/s are offered for a minute.
    const overload = { knee: 100, baseMs: 100, perSecond: 1_000, offeredPerMs: 3, ms: 10_000 };
    upstream.run(overload);
    const limits: number[] = [];
    let worst = 0;
    for (let i = 0; i < 5; i++) {
      const r = upstream.run(overload);
      limits.push(limit.limit);
      worst = Math.max(worst, r.p50);
    }
    // Past the knee each request more waits 1 ms: within the tolerance (1.25x) of the 100 ms baseline.
    expect(Math.max(...limits)).toBeLessThanOrEqual(200);
    expect(Math.min(...limits)).toBeGreaterThanOrEqual(60);
    expect(worst).toBeLessThanOrEqual(200);
  });

  it('follows an upstream that becomes slower: the next probe measures its new baseline', () => {
    const limit = adaptive({ max: 2_048 });
    const upstream = new Upstream(limit, clock);
    upstream.run({ knee: 100, baseMs: 100, perSecond: 1_000, offeredPerMs: 3, ms: 10_000 });
    // Three times slower per request (a heavier version): 300 ms each, the knee still at 100.
    const slower = { knee: 100, baseMs: 300, perSecond: 333, offeredPerMs: 3, ms: 10_000 };
    upstream.run(slower);
    const after = upstream.run(slower);
    // Compared with the old 100 ms baseline it would have fallen to min; it stays near the knee.
    expect(limit.limit).toBeGreaterThanOrEqual(60);
    expect(limit.limit).toBeLessThanOrEqual(200);
    expect(after.answered).toBeGreaterThan(0.8 * 333 * 10);
  });

  it('after an overload, grows back when the upstream has room again', () => {
    const limit = adaptive();
    const upstream = new Upstream(limit, clock);
    upstream.run({ knee: 50, baseMs: 100, perSecond: 500, offeredPerMs: 3, ms: 10_000 });
    const squeezed = limit.limit;
    expect(squeezed).toBeLessThan(128);
    upstream.run({ knee: 10_000, baseMs: 100, perSecond: 500, offeredPerMs: 3, ms: 20_000 });
    expect(limit.limit).toBeGreaterThanOrEqual(300);
  });

  it('comes down from a high limit to the knee within a second of a sudden overload', () => {
    const limit = adaptive({ max: 2_048 });
    const upstream = new Upstream(limit, clock);
    // 250 in flight at 100 ms with room for all: the limit grows past them.
    upstream.run({ knee: 10_000, baseMs: 100, perSecond: 1_000, offeredPerMs: 2.5, ms: 10_000 });
    expect(limit.limit).toBeGreaterThanOrEqual(250);
    // Then the upstream takes no more than 100 at once (1,000/s), and 3,000/s are offered.
    const overload = { knee: 100, baseMs: 100, perSecond: 1_000, offeredPerMs: 3, ms: 100 };
    const limits: number[] = [];
    for (let t = 0; t < 1_000; t += overload.ms) {
      upstream.run(overload);
      limits.push(limit.limit);
    }
    expect(limits.at(-1)).toBeLessThanOrEqual(150);
    expect(limits.at(-1)).toBeGreaterThanOrEqual(60);
    // And it stays near there: most requests of the next 4 s take the upstream's own 100 ms, none
    // waits behind the 400 that the limit let in at first.
    const after = upstream.run({ ...overload, ms: 4_000 });
    expect(after.p50).toBeLessThanOrEqual(125);
    expect(after.p99).toBeLessThanOrEqual(250);
    expect(after.answered).toBeGreaterThan(0.9 * 4_000);
  });

  it('measures a probe on whole cohorts: requests admitted at the limit, then at half of it', () => {
    const limit = adaptive({ min: 2, max: 4, windowSamples: 2, windowMs: 0 });
    const held = [0, 1, 2, 3].map(() => limit.tryAcquire()!);
    // Refused, but no probe yet: when the limit is first reached, no queue has formed behind it.
    expect(limit.tryAcquire()).toBeUndefined();
    expect(limit.snapshot().probing).toBe(false);
    limit.release(held[0]!, 1_000);
    limit.release(held[1]!, 1_000); // a window of 2 answers that refused requests
    held[0] = limit.tryAcquire()!;
    held[1] = limit.tryAcquire()!;
    expect(limit.tryAcquire()).toBeUndefined(); // refused after a refusing window: a probe starts at the limit
    expect(limit.snapshot()).toMatchObject({ probing: true, limit: 4 });
    // Answers of requests admitted before the probe are not its samples.
    for (const admitted of held.slice(0, 2)) limit.release(admitted, 1_000);
    const full = [limit.tryAcquire()!, limit.tryAcquire()!];
    // The full cohort (a quarter of the limit, at least a window's 2 samples) is admitted: the half
    // one starts, at half the limit, once that much is free.
    expect(limit.snapshot()).toMatchObject({ probing: true, limit: 2 });
    expect(limit.tryAcquire()).toBeUndefined();
    for (const admitted of held.slice(2)) limit.release(admitted, 1_000);
    limit.release(full[0]!, 100);
    const half = [limit.tryAcquire()!];
    limit.release(full[1]!); // failed: counted as answered, not sampled
    half.push(limit.tryAcquire()!);
    expect(limit.tryAcquire()).toBeUndefined();
    limit.release(half[0]!, 40);
    expect(limit.snapshot().probing).toBe(true); // until the last member of each is answered
    limit.release(half[1]!, 60);
    // 100 ms at the limit against 50 ms at half: a queue; by Little's law the knee is at half.
    expect(limit.snapshot()).toMatchObject({ probing: false, baselineMs: 50, recentMs: 100, limit: 2 });
  });

  it('a probe that finds no queue leaves the limit where it is', () => {
    const limit = adaptive({ min: 2, max: 8, windowSamples: 2, windowMs: 0 });
    const held = Array.from({ length: 8 }, () => limit.tryAcquire()!);
    expect(limit.tryAcquire()).toBeUndefined();
    limit.release(held[0]!, 10);
    limit.release(held[1]!, 10);
    held[0] = limit.tryAcquire()!;
    held[1] = limit.tryAcquire()!;
    expect(limit.tryAcquire()).toBeUndefined();
    expect(limit.snapshot().probing).toBe(true);
    for (const admitted of held) limit.release(admitted, 10);
    const full = Array.from({ length: 2 }, () => limit.tryAcquire()!);
    for (const admitted of full) limit.release(admitted, 110);
    const half = Array.from({ length: 2 }, () => limit.tryAcquire()!);
    for (const admitted of half) limit.release(admitted, 100);
    // 110 ms at the limit against 100 ms at half: within the tolerance (1.25x).
    expect(limit.snapshot()).toMatchObject({ probing: false, baselineMs: 100, recentMs: 110, limit: 8 });
  });
});
