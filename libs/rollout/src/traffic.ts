import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { type TrafficCounters, TrafficCountersSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/**
 * The gRPC codes that are the service's failures when a model version answers with them, as the
 * SLO's availability counts them (grafana/slo/slos.yaml, errorOutcomes): automatic rollouts compare
 * versions on these. The others are the client's doing (a bad tensor, a missing model, a cancel).
 */
export const SERVICE_ERROR_CODES: ReadonlySet<status> = new Set([
  status.UNAVAILABLE,
  status.INTERNAL,
  status.UNKNOWN,
  status.DATA_LOSS,
  status.DEADLINE_EXCEEDED,
  status.RESOURCE_EXHAUSTED,
]);

export function isServiceError(code: status): boolean {
  return SERVICE_ERROR_CODES.has(code);
}

/**
 * The latency bounds automatic rollouts count under: 2^(k/8) seconds, from about 0.1 ms to 10 s,
 * each 9 % above the last (the layout of Prometheus's native histograms, schema 3). A p99 read from
 * these counts is within a few per cent of the latencies' own, so that a p99_ratio gate of 1.2 judges
 * the versions and not the layout. The services' Prometheus histograms (LATENCY_BUCKETS_SECONDS) step
 * 2 to 2.5× between bounds: a p99 interpolated there moves by up to that much when the latencies
 * cross one bound, and a canary no slower than its stable version could fail any gate below 2.5×.
 */
export const ROLLOUT_LATENCY_BOUNDS_SECONDS: readonly number[] = Array.from(
  { length: 134 },
  (_, i) => 2 ** ((i - 106) / 8),
);

/** Zero counters with one latency count per bound plus one above the last. */
export function emptyCounters(bounds: readonly number[]): TrafficCounters {
  return create(TrafficCountersSchema, { latencyCounts: new Array<bigint>(bounds.length + 1).fill(0n) });
}

/** The index of the latency count a duration falls under: the first bound at or above it, else the last count. */
export function latencyIndex(seconds: number, bounds: readonly number[]): number {
  let low = 0;
  let high = bounds.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (seconds <= bounds[middle]!) high = middle;
    else low = middle + 1;
  }
  return low;
}

/** Adds `more` into `into` (latency counts index by index; `into` grows to the longer list). */
export function addCounters(into: TrafficCounters, more: TrafficCounters): TrafficCounters {
  into.requests += more.requests;
  into.errors += more.errors;
  into.failures += more.failures;
  into.shadowItems += more.shadowItems;
  into.shadowAgreed += more.shadowAgreed;
  for (let i = 0; i < more.latencyCounts.length; i += 1)
    into.latencyCounts[i] = (into.latencyCounts[i] ?? 0n) + more.latencyCounts[i]!;
  return into;
}

/**
 * What `now` counted since `before`, both whole counts since the same start. A count below its
 * baseline means the counting restarted (a registry without shared storage restarted), and latency
 * counts of another length that it counts under other bounds (a baseline kept by an older registry):
 * the whole of `now` is then what it counted since.
 */
export function countersSince(now: TrafficCounters, before: TrafficCounters | undefined): TrafficCounters {
  if (before === undefined) return create(TrafficCountersSchema, { ...now, latencyCounts: [...now.latencyCounts] });
  const restarted =
    now.requests < before.requests ||
    now.errors < before.errors ||
    now.failures < before.failures ||
    now.shadowItems < before.shadowItems ||
    now.shadowAgreed < before.shadowAgreed ||
    now.latencyCounts.length !== before.latencyCounts.length ||
    before.latencyCounts.some((c, i) => (now.latencyCounts[i] ?? 0n) < c);
  if (restarted) return countersSince(now, undefined);
  return create(TrafficCountersSchema, {
    requests: now.requests - before.requests,
    errors: now.errors - before.errors,
    failures: now.failures - before.failures,
    shadowItems: now.shadowItems - before.shadowItems,
    shadowAgreed: now.shadowAgreed - before.shadowAgreed,
    latencyCounts: now.latencyCounts.map((c, i) => c - (before.latencyCounts[i] ?? 0n)),
  });
}

/**
 * The q-quantile (0 < q <= 1) of the latencies counted, in milliseconds, interpolated linearly
 * within the bucket it falls in as Prometheus's histogram_quantile does (the first bucket from 0; a
 * quantile above the last bound is that bound). 0 when nothing was counted.
 */
export function latencyQuantileMs(counts: readonly bigint[], bounds: readonly number[], q: number): number {
  const total = counts.reduce((sum, c) => sum + Number(c), 0);
  if (total === 0) return 0;
  const rank = q * total;
  let below = 0;
  for (let i = 0; i < counts.length; i += 1) {
    const count = Number(counts[i]);
    if (below + count >= rank && count > 0) {
      if (i >= bounds.length) return bounds[bounds.length - 1]! * 1000;
      const lower = i === 0 ? 0 : bounds[i - 1]!;
      return (lower + (bounds[i]! - lower) * ((rank - below) / count)) * 1000;
    }
    below += count;
  }
  return bounds[bounds.length - 1]! * 1000;
}
