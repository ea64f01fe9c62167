import { create } from '@bufbuild/protobuf';
import { TrafficCountersSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { LATENCY_BUCKETS_SECONDS } from '@infermesh/telemetry';
import {
  addCounters,
  countersSince,
  emptyCounters,
  latencyIndex,
  latencyQuantileMs,
  ROLLOUT_LATENCY_BOUNDS_SECONDS,
} from './traffic';

const BOUNDS = [0.001, 0.01, 0.1];

describe(latencyQuantileMs.name, () => {
  it('interpolates within the bucket the quantile falls in, as histogram_quantile does', () => {
    // 100 requests: 50 at or under 1 ms, 50 between 1 and 10 ms.
    expect(latencyQuantileMs([50n, 50n, 0n, 0n], BOUNDS, 0.5)).toBeCloseTo(1);
    expect(latencyQuantileMs([50n, 50n, 0n, 0n], BOUNDS, 0.99)).toBeCloseTo(1 + 9 * (49 / 50));
    expect(latencyQuantileMs([10n, 0n, 0n, 0n], BOUNDS, 0.99)).toBeCloseTo(0.99);
  });

  it('is the last bound for a quantile above it, and 0 without requests', () => {
    expect(latencyQuantileMs([0n, 0n, 0n, 5n], BOUNDS, 0.99)).toBe(100);
    expect(latencyQuantileMs([0n, 0n, 0n, 0n], BOUNDS, 0.99)).toBe(0);
  });
});

describe('ROLLOUT_LATENCY_BOUNDS_SECONDS', () => {
  /** The p99 read from `bounds` of 1,000 latencies spread evenly over [0.5, 1.5] × `baseMs`. */
  const p99Of = (baseMs: number, bounds: readonly number[]) => {
    const counts = emptyCounters(bounds).latencyCounts;
    for (let i = 0; i < 1_000; i += 1) counts[latencyIndex((baseMs * (0.5 + i / 1_000)) / 1_000, bounds)]! += 1n;
    return latencyQuantileMs(counts, bounds, 0.99);
  };
  /** The p99 ratio of a canary 5 % slower than its stable version, read from `bounds`, at stable latencies from 1 to 100 ms. */
  const ratios = (bounds: readonly number[]) =>
    Array.from({ length: 461 }, (_, i) => 10 ** (i / 230)).map(
      (base) => p99Of(base * 1.05, bounds) / p99Of(base, bounds),
    );

  it('spans 0.1 ms to 10 s, each bound 2^(1/8) above the last', () => {
    expect(ROLLOUT_LATENCY_BOUNDS_SECONDS[0]).toBeLessThanOrEqual(0.0001 * 1.1);
    expect(ROLLOUT_LATENCY_BOUNDS_SECONDS.at(-1)).toBeGreaterThanOrEqual(10);
    for (let i = 1; i < ROLLOUT_LATENCY_BOUNDS_SECONDS.length; i += 1)
      expect(ROLLOUT_LATENCY_BOUNDS_SECONDS[i]! / ROLLOUT_LATENCY_BOUNDS_SECONDS[i - 1]!).toBeCloseTo(2 ** (1 / 8), 12);
  });

  it("reads a p99 ratio within 10 % of the latencies' own, whichever bounds they straddle", () => {
    const read = ratios(ROLLOUT_LATENCY_BOUNDS_SECONDS);
    expect(Math.min(...read)).toBeGreaterThan(1.05 / 1.1);
    expect(Math.max(...read)).toBeLessThan(1.05 * 1.1);
    // The services' histogram buckets, 2 to 2.5× apart, read the same 5 % as up to twice that: a
    // canary no slower than its stable version would fail a p99 gate of 1.2 there.
    expect(Math.max(...ratios(LATENCY_BUCKETS_SECONDS))).toBeGreaterThan(2);
  });
});

describe(latencyIndex.name, () => {
  it('is the first bound at or above the duration, or the count above the last', () => {
    const linear = (seconds: number) => {
      const i = ROLLOUT_LATENCY_BOUNDS_SECONDS.findIndex((bound) => seconds <= bound);
      return i === -1 ? ROLLOUT_LATENCY_BOUNDS_SECONDS.length : i;
    };
    const durations = [0, 1e-9, ...ROLLOUT_LATENCY_BOUNDS_SECONDS, 11, 1e6].flatMap((d) => [d, d * 1.0001, d * 0.9999]);
    for (const seconds of durations)
      expect(latencyIndex(seconds, ROLLOUT_LATENCY_BOUNDS_SECONDS)).toBe(linear(seconds));
  });
});

describe(countersSince.name, () => {
  const at = (requests: number, latency: number[]) =>
    create(TrafficCountersSchema, { requests: BigInt(requests), latencyCounts: latency.map(BigInt) });

  it('is what was counted after the baseline', () => {
    expect(countersSince(at(30, [5, 20, 0, 0]), at(10, [5, 0, 0, 0]))).toMatchObject({
      requests: 20n,
      latencyCounts: [0n, 20n, 0n, 0n],
    });
  });

  it('is everything counted when the baseline counted latencies under other bounds', () => {
    expect(countersSince(at(30, [5, 20, 0, 0]), at(10, [5, 0, 0]))).toMatchObject({
      requests: 30n,
      latencyCounts: [5n, 20n, 0n, 0n],
    });
  });

  it('is everything counted when the counts restarted below the baseline', () => {
    expect(countersSince(at(3, [3, 0, 0, 0]), at(10, [10, 0, 0, 0]))).toMatchObject({
      requests: 3n,
      latencyCounts: [3n, 0n, 0n, 0n],
    });
  });
});

describe(addCounters.name, () => {
  it('adds index by index', () => {
    const into = emptyCounters(BOUNDS);
    addCounters(into, at(BOUNDS.length));
    expect(into.latencyCounts[latencyIndex(0.005, BOUNDS)]).toBe(1n);
    expect(latencyIndex(5, BOUNDS)).toBe(3);
  });

  function at(n: number) {
    const c = emptyCounters(BOUNDS);
    c.latencyCounts[1] = 1n;
    c.requests = BigInt(n);
    return c;
  }
});
