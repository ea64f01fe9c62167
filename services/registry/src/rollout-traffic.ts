import type { TrafficCounters } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { countersSince, ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import type { TrafficLedger } from './traffic-ledger';

/**
 * Where automatic rollouts read what a version served over a step: the routers' reports (the
 * registry's ledger), or Prometheus when PROMETHEUS_URL is set.
 */
export abstract class RolloutTraffic {
  /** The bounds the latency counts it gives count under. */
  abstract readonly latencyBoundsSeconds: readonly number[];
  /** What to keep at a step's start to measure the step later; undefined when the source needs nothing. */
  abstract mark(modelId: string, versionId: string): Promise<TrafficCounters | undefined>;
  /** What the version served since the step started (`mark` is what mark() gave then). */
  abstract since(
    modelId: string,
    versionId: string,
    mark: TrafficCounters | undefined,
    stepStart: Date,
    now: Date,
  ): Promise<TrafficCounters>;
}

/** The routers' reports: the ledger's counts now, less those at the step's start. */
export class LedgerRolloutTraffic extends RolloutTraffic {
  readonly latencyBoundsSeconds = ROLLOUT_LATENCY_BOUNDS_SECONDS;

  constructor(private readonly ledger: TrafficLedger) {
    super();
  }

  mark(modelId: string, versionId: string): Promise<TrafficCounters> {
    return this.ledger.read(modelId, versionId);
  }

  async since(modelId: string, versionId: string, mark: TrafficCounters | undefined): Promise<TrafficCounters> {
    return countersSince(await this.ledger.read(modelId, versionId), mark);
  }
}
