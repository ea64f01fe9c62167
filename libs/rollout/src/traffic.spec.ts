import { create } from '@bufbuild/protobuf';
import { TrafficCountersSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { addCounters, countersSince, emptyCounters, latencyIndex, latencyQuantileMs } from './traffic';

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

describe(countersSince.name, () => {
  const at = (requests: number, latency: number[]) =>
    create(TrafficCountersSchema, { requests: BigInt(requests), latencyCounts: latency.map(BigInt) });

  it('is what was counted after the baseline', () => {
    expect(countersSince(at(30, [5, 20, 0, 0]), at(10, [5, 0, 0, 0]))).toMatchObject({
      requests: 20n,
      latencyCounts: [0n, 20n, 0n, 0n],
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
