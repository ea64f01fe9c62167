import { create } from '@bufbuild/protobuf';
import type { OnApplicationShutdown } from '@nestjs/common';
import { Errors } from '@infermesh/grpc';
import {
  type ReportTrafficRequest,
  type TrafficCounters,
  TrafficCountersSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { addCounters, emptyCounters, ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import { parseVersionName } from './resource-name-check';

/** The most versions one report may carry. */
export const MAX_REPORTED_VERSIONS = 10_000;

/** What a router served of one version since its last report. */
export interface TrafficDelta {
  readonly modelId: string;
  readonly versionId: string;
  readonly counters: TrafficCounters;
}

/**
 * Whole traffic counts per model version, summed over every router's reports since the ledger
 * started (an embedded ledger starts with the registry; a Redis one is shared by the replicas and
 * outlives them). Automatic rollouts read it at a step's start and since; latency counts are under
 * ROLLOUT_LATENCY_BOUNDS_SECONDS.
 */
export abstract class TrafficLedger implements OnApplicationShutdown {
  /** Adds the deltas atomically per version. */
  abstract add(deltas: readonly TrafficDelta[]): Promise<void>;
  /** The counts of a version so far (zeros when nothing was reported). */
  abstract read(modelId: string, versionId: string): Promise<TrafficCounters>;
  abstract close(): Promise<void>;

  onApplicationShutdown(): Promise<void> {
    return this.close();
  }
}

/** The registry's ledger without Redis: in memory, from the registry's start. */
export class EmbeddedTrafficLedger extends TrafficLedger {
  private readonly counts = new Map<string, TrafficCounters>();

  add(deltas: readonly TrafficDelta[]): Promise<void> {
    for (const { modelId, versionId, counters } of deltas) {
      const key = `${modelId}/${versionId}`;
      let total = this.counts.get(key);
      if (total === undefined) this.counts.set(key, (total = emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS)));
      addCounters(total, counters);
    }
    return Promise.resolve();
  }

  read(modelId: string, versionId: string): Promise<TrafficCounters> {
    const total = this.counts.get(`${modelId}/${versionId}`);
    return Promise.resolve(
      total === undefined
        ? emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS)
        : create(TrafficCountersSchema, { ...total, latencyCounts: [...total.latencyCounts] }),
    );
  }

  close(): Promise<void> {
    this.counts.clear();
    return Promise.resolve();
  }
}

/**
 * The deltas a router's report carries, checked: latency bounds the registry's own
 * (ROLLOUT_LATENCY_BOUNDS_SECONDS, which the routers count under), one latency count per bound and one above,
 * version names well formed, at most MAX_REPORTED_VERSIONS. Refuses with INVALID_ARGUMENT naming
 * the problem.
 */
export function trafficDeltas(request: ReportTrafficRequest): TrafficDelta[] {
  const bounds = request.latencyBoundsSeconds;
  const expected = ROLLOUT_LATENCY_BOUNDS_SECONDS;
  if (bounds.length !== expected.length || bounds.some((b, i) => b !== expected[i])) {
    const shown =
      bounds.length <= 4 ? `[${bounds.join(', ')}]` : `${bounds.length} bounds from ${bounds[0]} to ${bounds.at(-1)}`;
    throw Errors.invalidRequest(
      `traffic report: latency_bounds_seconds is ${shown}; the registry counts under ${expected.length} bounds, 2^(k/8) s from ${expected[0]} to ${expected.at(-1)} (a router of another release?)`,
    );
  }
  if (request.versions.length > MAX_REPORTED_VERSIONS) {
    throw Errors.invalidRequest(
      `traffic report: ${request.versions.length} versions; at most ${MAX_REPORTED_VERSIONS} per report`,
    );
  }
  return request.versions.map((entry, i) => {
    const { modelId, versionId } = parseVersionName(entry.name, `versions[${i}].name`);
    const counters = entry.counters ?? create(TrafficCountersSchema);
    if (counters.latencyCounts.length > bounds.length + 1) {
      throw Errors.invalidRequest(
        `traffic report: versions[${i}] has ${counters.latencyCounts.length} latency counts; at most ${bounds.length + 1} (one per bound and one above)`,
      );
    }
    return { modelId, versionId, counters };
  });
}
