import { type Clock, systemClock } from '@infermesh/clock';

/** The settings of a concurrency limit. */
export interface ConcurrencyLimitOptions {
  /** The limit never goes below this. */
  min: number;
  /** The limit never goes above this; a fixed limit stays here. */
  max: number;
  /** false: a fixed limit of `max`. */
  adaptive: boolean;
  /** How far latency may rise over its baseline before the limit comes down (1.25: by a quarter). */
  tolerance?: number;
  /** The shortest window of latency samples, and the fewest samples in one. */
  windowMs?: number;
  windowSamples?: number;
  /** How often, while requests are refused, a probe measures the latency at the limit and at half of it. */
  probeIntervalMs?: number;
  /** Time: its monotonic clock measures windows and probe intervals (systemClock unless given). */
  clock?: Clock;
}

const DEFAULTS = { tolerance: 1.25, windowMs: 100, windowSamples: 10, probeIntervalMs: 2_000 };
/** The share of a window's new limit that moves the limit: down quickly (a queue is building), up slowly. */
const SMOOTHING = { down: 0.5, up: 0.2 };
/** The limit a gateway starts with, within [min, max]: well above what one client needs, well below a flood. */
const INITIAL_LIMIT = 128;
/** The longest a probe's cohort takes admissions: when requests come slower than that, it is measured as it is. */
const COHORT_MS = 1_000;

/** The admission number of a request that belongs to no probe's cohort. */
const OUTSIDE = -1;

/** What the limit is now, and what it is made of. */
export interface ConcurrencySnapshot {
  limit: number;
  inFlight: number;
  /** Mean latency of the last window's answers, and the baseline it is compared with; NaN before the first. */
  recentMs: number;
  baselineMs: number;
  probing: boolean;
}

/**
 * Requests admitted one after another from a given moment, to be measured together: the mean latency
 * of a whole cohort, once its last member is answered, is not biased towards the fast answers the way
 * a window of whatever was answered in the last 100 ms is while a queue grows or drains.
 */
class Cohort {
  admitted = 0;
  released = 0;
  samples = 0;
  sumMs = 0;
  open = true;

  constructor(
    /** The admission number its members carry. */
    readonly id: number,
    /** How many it admits at most. */
    readonly size: number,
    /** When it started to admit. */
    readonly openedAt: number,
  ) {}

  get done(): boolean {
    return !this.open && this.released === this.admitted;
  }

  get meanMs(): number {
    return this.samples === 0 ? Number.NaN : this.sumMs / this.samples;
  }
}

/** A probe's two cohorts: at the limit, then at half of it, from when the first has admitted all its members. */
interface Probe {
  full: Cohort;
  half: Cohort | undefined;
}

/**
 * How many requests may be in flight at once, adapted to the latency they get: a gradient limiter
 * in the way of Envoy's adaptive concurrency filter and Netflix's concurrency-limits, with a probe
 * suited to batching upstreams.
 *
 * Answers are sampled in windows (at least `windowMs` and `windowSamples` answers). While a window's
 * mean latency stays within `tolerance` times the baseline, the limit grows by about its square root
 * each window, if the window used at least three quarters of it; beyond, if the window refused requests, it
 * shrinks in proportion (by at most a quarter a window: half of it, smoothed). A limit that refuses
 * nothing does not shrink: slower answers below it are the upstream's own, not a queue the limit let build.
 *
 * The baseline is not the latency of an idle upstream: a batching upstream answers one request
 * alone in a few milliseconds, and a hundred together in tens, at ten times the throughput. It is
 * measured by a probe, at most every `probeIntervalMs` while requests are being refused: a cohort of
 * requests is admitted at the limit, then another at half the limit, and each cohort's mean latency
 * is taken once all its members are answered (a window of whatever was answered lately is biased
 * towards fast answers while a queue grows or drains). Below the upstream's knee, the half cohort
 * takes about as long as the full one (batch delay and compute dominate) and the limit stands. Past
 * it, requests wait in a queue, and by Little's law the knee is about the limit times the half
 * cohort's latency over the full one's: the limit comes down to that at once, and the next probe
 * follows after one window, until the two latencies are within `tolerance`. So a sudden overload is
 * brought down to the knee in a few probes, each about one latency at the limit long, rather than by
 * a quarter per window; and the limit neither follows a growing queue upwards nor falls to what an
 * idle upstream would need. The half cohort's mean is the baseline of the windows that follow.
 * Failed requests are not sampled: a fast failure says nothing of capacity.
 */
export class ConcurrencyLimit {
  private current: number;
  private inFlightNow = 0;
  private readonly clock: Clock;
  private readonly tolerance: number;
  private readonly windowMs: number;
  private readonly windowSamples: number;
  private readonly probeIntervalMs: number;
  private windowStart: number;
  private windowCount = 0;
  private windowSumMs = 0;
  private windowPeak = 0;
  private windowRefused = false;
  private recent = Number.NaN;
  private baseline = Number.NaN;
  /** Cohorts are numbered, and their members carry the number; every other admission carries OUTSIDE. */
  private cohorts = 0;
  /** A probe's two cohorts, at the limit and at half of it; undefined while no probe runs. */
  private probe: Probe | undefined;
  /** When the next probe may start. */
  private nextProbeAt = Number.NEGATIVE_INFINITY;
  /**
   * Whether the last whole window refused requests too. A probe waits for that: when the limit is first
   * reached, the queue behind it has not formed yet, and a probe then would find none.
   */
  private lastWindowRefused = false;

  constructor(private readonly options: ConcurrencyLimitOptions) {
    if (!(options.min >= 1 && options.max >= options.min))
      throw new RangeError(
        `concurrency limit bounds must be 1 <= min <= max, got min ${options.min}, max ${options.max}`,
      );
    this.clock = options.clock ?? systemClock;
    this.tolerance = options.tolerance ?? DEFAULTS.tolerance;
    this.windowMs = options.windowMs ?? DEFAULTS.windowMs;
    this.windowSamples = options.windowSamples ?? DEFAULTS.windowSamples;
    this.probeIntervalMs = options.probeIntervalMs ?? DEFAULTS.probeIntervalMs;
    this.current = options.adaptive ? Math.min(options.max, Math.max(options.min, INITIAL_LIMIT)) : options.max;
    this.windowStart = this.clock.monotonic();
  }

  /** The requests that may be in flight now: half the limit while a probe measures its half cohort. */
  get limit(): number {
    const limit = Math.floor(this.current);
    return this.probe?.half === undefined ? limit : this.halfOf(limit);
  }

  get inFlight(): number {
    return this.inFlightNow;
  }

  snapshot(): ConcurrencySnapshot {
    return {
      limit: this.limit,
      inFlight: this.inFlightNow,
      recentMs: this.recent,
      baselineMs: this.baseline,
      probing: this.probe !== undefined,
    };
  }

  /** Whether a request arriving now is to be refused: no place is free. Counts as a refusal. */
  refuses(): boolean {
    if (this.inFlightNow < this.limit) return false;
    this.windowRefused = true;
    if (
      this.options.adaptive &&
      this.probe === undefined &&
      this.lastWindowRefused &&
      this.clock.monotonic() >= this.nextProbeAt
    )
      this.startProbe();
    return true;
  }

  /** Takes a place if one is free: its admission number, to give to `release`; undefined means refuse. */
  tryAcquire(): number | undefined {
    if (this.refuses()) return undefined;
    this.inFlightNow += 1;
    if (this.inFlightNow > this.windowPeak) this.windowPeak = this.inFlightNow;
    return this.probe === undefined ? OUTSIDE : this.admitToProbe(this.probe);
  }

  /** Gives a place back; `latencyMs` when the request was answered, not when it failed. */
  release(admitted: number, latencyMs?: number): void {
    this.inFlightNow -= 1;
    if (!this.options.adaptive) return;
    const probe = this.probe;
    if (probe !== undefined) {
      // While a probe runs, only its cohorts are measured.
      this.advance(probe);
      const cohort = admitted === probe.full.id ? probe.full : admitted === probe.half?.id ? probe.half : undefined;
      if (cohort === undefined) return;
      cohort.released += 1;
      if (latencyMs !== undefined) {
        cohort.samples += 1;
        cohort.sumMs += latencyMs;
      }
      if (probe.full.done && probe.half?.done === true) this.endProbe(probe.full, probe.half);
      return;
    }
    if (latencyMs === undefined) return;
    this.windowCount += 1;
    this.windowSumMs += latencyMs;
    const now = this.clock.monotonic();
    if (this.windowCount >= this.windowSamples && now - this.windowStart >= this.windowMs) this.endWindow(now);
  }

  private halfOf(limit: number): number {
    return Math.max(this.options.min, Math.floor(limit / 2));
  }

  private startProbe(): void {
    const limit = Math.floor(this.current);
    this.probe = { full: new Cohort(++this.cohorts, this.cohortSize(limit), this.clock.monotonic()), half: undefined };
  }

  /** The admission number of a request admitted while a probe runs: its cohort's, or OUTSIDE. */
  private admitToProbe(probe: Probe): number {
    this.advance(probe);
    const cohort = probe.half ?? probe.full;
    // The half cohort's members wait behind no more than half the limit; a request let in under
    // the full limit just before it started may not.
    if (!cohort.open || (cohort === probe.half && this.inFlightNow > this.limit)) return OUTSIDE;
    cohort.admitted += 1;
    if (cohort.admitted >= cohort.size) cohort.open = false;
    this.advance(probe);
    return cohort.id;
  }

  /** Closes the cohort that has admitted for COHORT_MS; starts the half cohort once the full one is closed. */
  private advance(probe: Probe): void {
    const now = this.clock.monotonic();
    const cohort = probe.half ?? probe.full;
    if (cohort.open && now - cohort.openedAt >= COHORT_MS) cohort.open = false;
    if (!probe.full.open && probe.half === undefined)
      probe.half = new Cohort(++this.cohorts, this.cohortSize(this.halfOf(Math.floor(this.current))), now);
  }

  /**
   * A quarter of the requests a limit lets in (at least a window's samples): members admitted one after
   * another while the limit holds each wait behind all the others in flight, so a quarter of them
   * measures what all would, in a quarter of the time it takes to admit them all.
   */
  private cohortSize(limit: number): number {
    return Math.min(limit, Math.max(this.windowSamples, Math.ceil(limit / 4)));
  }

  private endProbe(full: Cohort, half: Cohort): void {
    this.probe = undefined;
    const now = this.clock.monotonic();
    this.resetWindow(now);
    this.lastWindowRefused = false;
    this.nextProbeAt = now + this.probeIntervalMs;
    const atLimit = full.meanMs;
    const atHalf = half.meanMs;
    // Cohorts that only failed measured nothing.
    if (Number.isNaN(atLimit) || Number.isNaN(atHalf)) return;
    this.recent = atLimit;
    this.baseline = atHalf;
    if (atLimit <= this.tolerance * atHalf) return;
    // A queue at the limit: down to the knee where Little's law puts it, the limit times the half
    // cohort's latency over the full one's (at most by half: the probe saw no lower), and probe
    // again after one window.
    this.current = Math.max(this.options.min, this.current * Math.max(0.5, atHalf / atLimit));
    this.nextProbeAt = now + this.windowMs;
  }

  private resetWindow(now: number): void {
    this.windowStart = now;
    this.windowCount = 0;
    this.windowSumMs = 0;
    this.windowPeak = this.inFlightNow;
    this.windowRefused = false;
  }

  private endWindow(now: number): void {
    const recent = this.windowSumMs / this.windowCount;
    const used = this.windowPeak;
    const refused = this.windowRefused;
    this.resetWindow(now);
    this.recent = recent;
    this.lastWindowRefused = refused;
    // A limit the requests did not come near tells nothing about a higher one: it does not grow.
    if (used < (this.current * 3) / 4) return;
    const gradient = Number.isNaN(this.baseline)
      ? 1
      : Math.min(1, Math.max(0.5, (this.tolerance * this.baseline) / recent));
    // Only refusals bring it down: below the limit, slower answers are the upstream's, not a queue the limit let build.
    if (gradient < 1 && !refused) return;
    const next = this.current * gradient + Math.sqrt(this.current);
    const smoothing = next < this.current ? SMOOTHING.down : SMOOTHING.up;
    this.current = Math.min(
      this.options.max,
      Math.max(this.options.min, this.current * (1 - smoothing) + next * smoothing),
    );
  }
}
