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
  /** How often, while requests are refused, the baseline is measured again at half the limit. */
  probeIntervalMs?: number;
  /** Time: its monotonic clock measures windows and probe intervals (systemClock unless given). */
  clock?: Clock;
}

const DEFAULTS = { tolerance: 1.25, windowMs: 100, windowSamples: 10, probeIntervalMs: 2_000 };
/** The share of a window's new limit that moves the limit: down quickly (a queue is building), up slowly. */
const SMOOTHING = { down: 0.5, up: 0.2 };
/** The limit a gateway starts with, within [min, max]: well above what one client needs, well below a flood. */
const INITIAL_LIMIT = 128;

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
 * How many requests may be in flight at once, adapted to the latency they get: a gradient limiter
 * in the way of Envoy's adaptive concurrency filter and Netflix's concurrency-limits, with a baseline
 * suited to batching upstreams.
 *
 * Answers are sampled in windows (at least `windowMs` and `windowSamples` answers). While a window's
 * mean latency stays within `tolerance` times the baseline, the limit grows by about its square root
 * each window, if the window used at least half of it; beyond, if the window refused requests, it
 * shrinks in proportion (by at most a quarter a window: half of it, smoothed). A limit that refuses nothing does
 * not shrink: slower answers below it are the upstream's own, not a queue the limit let build.
 *
 * The baseline is not the latency of an idle upstream: a batching upstream answers one request
 * alone in a few milliseconds, and a hundred together in tens, at ten times the throughput. It is
 * the latency at half the limit, measured by a probe: while requests are being refused, every
 * `probeIntervalMs` the limit is halved until a window of requests admitted under it has been
 * answered. Below the upstream's knee, half the requests take about as long (the batch delay and
 * compute dominate), and the limit stands; past it they wait in a queue, half of them take half as
 * long, and the limit comes down to the knee. So the limit neither follows a growing queue upwards
 * nor falls to what an idle upstream would need. Failed requests are not sampled: a fast failure
 * says nothing of capacity.
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
  /** Admissions are numbered by probe: a probe's window samples only the requests admitted under it. */
  private generation = 0;
  private probing = false;
  private lastProbe = Number.NEGATIVE_INFINITY;

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

  /** The requests that may be in flight now: half the limit while a probe runs. */
  get limit(): number {
    const limit = Math.floor(this.current);
    return this.probing ? Math.max(this.options.min, Math.floor(limit / 2)) : limit;
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
      probing: this.probing,
    };
  }

  /** Whether a request arriving now is to be refused: no place is free. Counts as a refusal. */
  refuses(): boolean {
    if (this.inFlightNow < this.limit) return false;
    this.windowRefused = true;
    if (this.options.adaptive && !this.probing && this.clock.monotonic() - this.lastProbe >= this.probeIntervalMs)
      this.startProbe();
    return true;
  }

  /** Takes a place if one is free: its admission number, to give to `release`; undefined means refuse. */
  tryAcquire(): number | undefined {
    if (this.refuses()) return undefined;
    this.inFlightNow += 1;
    if (this.inFlightNow > this.windowPeak) this.windowPeak = this.inFlightNow;
    return this.generation;
  }

  /** Gives a place back; `latencyMs` when the request was answered, not when it failed. */
  release(admitted: number, latencyMs?: number): void {
    this.inFlightNow -= 1;
    if (latencyMs === undefined || !this.options.adaptive) return;
    // A probe measures only what was admitted at half the limit.
    if (this.probing && admitted !== this.generation) return;
    this.windowCount += 1;
    this.windowSumMs += latencyMs;
    const now = this.clock.monotonic();
    if (this.windowCount >= this.windowSamples && now - this.windowStart >= this.windowMs) this.endWindow(now);
  }

  private startProbe(): void {
    this.probing = true;
    this.generation += 1;
    this.lastProbe = this.clock.monotonic();
    this.resetWindow(this.lastProbe);
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
    if (this.probing) {
      this.probing = false;
      this.baseline = recent;
      return;
    }
    // A limit the requests did not come near tells nothing about a higher one: it does not grow.
    if (used < this.current / 2) return;
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
