import { type Clock, systemClock } from '@infermesh/clock';
import type { OutlierDetection } from './mesh-policy';

/**
 * Outlier detection for an edge whose caller picks the endpoints itself (the batcher's workers), with
 * Envoy's semantics (envoy.config.cluster.v3.OutlierDetection, as gRFC A50 has gRPC clients do it):
 * consecutive failures eject an endpoint at once; failure percentage and success rate eject at the
 * sweeps, from the calls of the interval before. An ejection lasts baseEjectionTime × the endpoint's
 * ejection multiplier, which grows by one with each ejection and shrinks by one each interval the
 * endpoint is in service, and ends at the first sweep after its time is up.
 */

/** What became of one call to an endpoint. */
export type CallOutcome =
  /** The endpoint answered (which answers count as failures is the caller's choice). */
  | 'success'
  /** Any failure of the endpoint (Envoy: a 5xx). */
  | 'failure'
  /** The endpoint could not be reached or dropped the call: connect error, reset, UNAVAILABLE (Envoy: 502/503/504). */
  | 'gateway_failure';

/** The rules that eject an endpoint (Envoy's `ejections_enforced_*` counters). */
export type EjectionRule =
  'consecutive_failures' | 'consecutive_gateway_failures' | 'failure_percentage' | 'success_rate';

/** Envoy's default max_ejection_time: an ejection lasts at most this, or baseEjectionTime when that is longer. */
export const DEFAULT_MAX_EJECTION_TIME_MS = 300_000;

/**
 * A sweep ends the ejections that are up within this many milliseconds of it. The owner's interval
 * timer runs on Node's whole-millisecond loop clock and may fire a little before `interval` has passed
 * on the monotonic clock; without the slack, about half of the ejections made by a sweep would last one
 * interval too long.
 */
export const SWEEP_SLACK_MS = 5;

/** What is known of one endpoint. */
interface EndpointState {
  /** Failures in a row (gateway failures included), since the last success. */
  consecutiveFailures: number;
  /** Gateway failures in a row, since the last success or other failure. */
  consecutiveGatewayFailures: number;
  /** Calls since the last sweep. */
  calls: number;
  /** Successful calls since the last sweep. */
  successes: number;
  /** When the ejection in force began; undefined: in service. */
  ejectedAt: number | undefined;
  /** When the last ejection ended; undefined: never ejected. */
  unejectedAt: number | undefined;
  /** Envoy's ejection time backoff: an ejection lasts baseEjectionTime × this. */
  multiplier: number;
}

/** One endpoint's calls over the interval that just ended. */
interface IntervalSample<K> {
  key: K;
  state: EndpointState;
  calls: number;
  /** Successful calls in percent. */
  successRate: number;
}

/**
 * Tracks the outcomes of calls to a set of endpoints and ejects the outliers. The owner records
 * every call's outcome, skips the endpoints that are ejected, and calls `sweep()` every `interval`.
 */
export class OutlierDetector<K> {
  private settings: OutlierDetection;
  private readonly endpoints = new Map<K, EndpointState>();
  private ejectedCount = 0;
  private readonly ejectionCounts: Record<EjectionRule, number> = {
    consecutive_failures: 0,
    consecutive_gateway_failures: 0,
    failure_percentage: 0,
    success_rate: 0,
  };

  /** Counters for metrics: ejections made, by rule (those the max ejection percent prevented are not counted). */
  readonly ejections: Readonly<Record<EjectionRule, number>> = this.ejectionCounts;

  /**
   * @param settings the edge's outlier detection, from the mesh policy.
   * @param clock time, read on its monotonic clock (systemClock unless given).
   */
  constructor(
    settings: OutlierDetection,
    private readonly clock: Clock = systemClock,
  ) {
    this.settings = settings;
  }

  /**
   * Replaces the settings (a policy pushed at run time). Ejections in force stay, and end when the new
   * settings' ejection time is up; consecutive runs and the interval's counts stay too.
   */
  configure(settings: OutlierDetection): void {
    this.settings = settings;
  }

  /** The endpoints there are now; what was known of the others is forgotten (one that comes back starts afresh). */
  setEndpoints(keys: Iterable<K>): void {
    const next = new Set(keys);
    for (const [key, state] of this.endpoints) {
      if (next.has(key)) continue;
      if (state.ejectedAt !== undefined) this.ejectedCount--;
      this.endpoints.delete(key);
    }
    for (const key of next) {
      if (!this.endpoints.has(key)) this.endpoints.set(key, newEndpointState());
    }
  }

  /**
   * One call's outcome. A gateway failure counts as a failure too; a plain failure ends a run of
   * gateway failures and a success ends both runs. Outcomes of endpoints that are not in the set
   * (calls that were under way when it was removed) are ignored. Returns true when this outcome
   * ejected the endpoint.
   */
  record(key: K, outcome: CallOutcome): boolean {
    const state = this.endpoints.get(key);
    if (state === undefined) return false;
    state.calls++;
    if (outcome === 'success') {
      state.successes++;
      state.consecutiveFailures = 0;
      state.consecutiveGatewayFailures = 0;
      return false;
    }
    state.consecutiveFailures++;
    if (outcome === 'gateway_failure') state.consecutiveGatewayFailures++;
    else state.consecutiveGatewayFailures = 0;

    // As Envoy: the run that reached its threshold starts over whether or not the max ejection
    // percent let the ejection happen; an endpoint already ejected keeps its runs until it is back.
    const { consecutiveFailures, consecutiveGatewayFailures } = this.settings;
    let ejected = false;
    if (
      consecutiveGatewayFailures > 0 &&
      state.consecutiveGatewayFailures >= consecutiveGatewayFailures &&
      state.ejectedAt === undefined
    ) {
      ejected = this.eject(state, 'consecutive_gateway_failures', this.clock.monotonic());
      state.consecutiveGatewayFailures = 0;
    }
    if (consecutiveFailures > 0 && state.consecutiveFailures >= consecutiveFailures && state.ejectedAt === undefined) {
      ejected = this.eject(state, 'consecutive_failures', this.clock.monotonic());
      state.consecutiveFailures = 0;
    }
    return ejected;
  }

  /** Whether the endpoint is ejected now (the caller should not pick it); false for one not in the set. */
  isEjected(key: K): boolean {
    return this.endpoints.get(key)?.ejectedAt !== undefined;
  }

  /** How many endpoints are ejected now (Envoy's `ejections_active`). */
  get activeEjections(): number {
    return this.ejectedCount;
  }

  /**
   * Call every `interval` ms (the owner keeps the timer). Ends the ejections whose time is up (their
   * consecutive runs start over), runs success-rate and failure-percentage ejection on the counts of
   * the interval that just ended, then starts the next interval's counts, and lowers by one the
   * ejection multiplier of each endpoint that has been back in service for an interval. Returns the
   * endpoints it ejected.
   */
  sweep(): K[] {
    const now = this.clock.monotonic();
    for (const state of this.endpoints.values()) {
      if (state.ejectedAt !== undefined && now - state.ejectedAt + SWEEP_SLACK_MS >= this.ejectionTimeMs(state)) {
        state.ejectedAt = undefined;
        state.unejectedAt = now;
        state.consecutiveFailures = 0;
        state.consecutiveGatewayFailures = 0;
        this.ejectedCount--;
      }
    }

    // Endpoints ejected now are left out, as Envoy does: they cannot be ejected again, and their
    // few calls would only skew the others' statistics.
    const samples: IntervalSample<K>[] = [];
    for (const [key, state] of this.endpoints) {
      if (state.ejectedAt === undefined && state.calls > 0) {
        samples.push({ key, state, calls: state.calls, successRate: (state.successes * 100) / state.calls });
      }
      state.calls = 0;
      state.successes = 0;
    }

    const ejected: K[] = [];
    const { successRate, failurePercentage } = this.settings;
    if (successRate !== undefined) {
      const eligible = samples.filter((s) => s.calls >= successRate.requestVolume);
      if (eligible.length > 0 && eligible.length >= successRate.minimumHosts) {
        const mean = eligible.reduce((sum, s) => sum + s.successRate, 0) / eligible.length;
        const variance = eligible.reduce((sum, s) => sum + (s.successRate - mean) ** 2, 0) / eligible.length;
        const threshold = mean - (successRate.stdevFactor / 1000) * Math.sqrt(variance);
        // The worst first, so that the max ejection percent leaves the better ones in service.
        for (const sample of worstFirst(eligible.filter((s) => s.successRate < threshold))) {
          if (this.eject(sample.state, 'success_rate', now)) ejected.push(sample.key);
        }
      }
    }
    if (failurePercentage !== undefined) {
      const eligible = samples.filter((s) => s.calls >= failurePercentage.requestVolume);
      if (eligible.length > 0 && eligible.length >= failurePercentage.minimumHosts) {
        const failing = eligible.filter(
          (s) => 100 - s.successRate >= failurePercentage.threshold && s.state.ejectedAt === undefined,
        );
        for (const sample of worstFirst(failing)) {
          if (this.eject(sample.state, 'failure_percentage', now)) ejected.push(sample.key);
        }
      }
    }

    for (const state of this.endpoints.values()) {
      if (
        state.ejectedAt === undefined &&
        state.multiplier > 0 &&
        state.unejectedAt !== undefined &&
        now - state.unejectedAt + SWEEP_SLACK_MS >= this.settings.interval
      ) {
        state.multiplier--;
      }
    }
    return ejected;
  }

  /** How long the endpoint's ejection lasts: base × multiplier, at most max(300 s, base) as Envoy. */
  private ejectionTimeMs(state: EndpointState): number {
    return Math.min(this.settings.baseEjectionTime * state.multiplier, this.maxEjectionTimeMs());
  }

  private maxEjectionTimeMs(): number {
    return Math.max(DEFAULT_MAX_EJECTION_TIME_MS, this.settings.baseEjectionTime);
  }

  /**
   * Ejects the endpoint unless that would pass the max ejection percent: as gRFC A50 (and Envoy
   * before always_eject_one_host), only while the share already ejected is under it, so one endpoint
   * of a few may be ejected even when it alone is more than the percent. Returns whether it did.
   */
  private eject(state: EndpointState, rule: EjectionRule, now: number): boolean {
    if ((this.ejectedCount * 100) / this.endpoints.size >= this.settings.maxEjectionPercent) return false;
    state.ejectedAt = now;
    this.ejectedCount++;
    this.ejectionCounts[rule]++;
    // Envoy stops the multiplier once base × multiplier reaches max + base, so that an endpoint that
    // keeps failing is ejected for the max, and one interval in service does not bring that down.
    const base = this.settings.baseEjectionTime;
    if (state.multiplier * base < this.maxEjectionTimeMs() + base) state.multiplier++;
    return true;
  }
}

function newEndpointState(): EndpointState {
  return {
    consecutiveFailures: 0,
    consecutiveGatewayFailures: 0,
    calls: 0,
    successes: 0,
    ejectedAt: undefined,
    unejectedAt: undefined,
    multiplier: 0,
  };
}

/** The samples by success rate, the lowest first (a stable sort: ties keep the endpoints' order). */
function worstFirst<K>(samples: IntervalSample<K>[]): IntervalSample<K>[] {
  return [...samples].sort((a, b) => a.successRate - b.successRate);
}
