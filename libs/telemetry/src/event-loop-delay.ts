import { monitorEventLoopDelay } from 'node:perf_hooks';
import * as prom from 'prom-client';

/** How often the monitor's timer ticks: an idle service should not wake up a hundred times a second. */
export const EVENT_LOOP_DELAY_RESOLUTION_MS = 100;

/**
 * How late the event loop ran, in seconds, from a delay Node's monitorEventLoopDelay recorded (ns) at
 * `resolutionMs`: Node records the whole interval between two ticks of its timer, so an idle loop
 * reads the resolution itself; what is beyond it is the lateness.
 */
export function delayBeyondResolutionSeconds(ns: number, resolutionMs: number): number {
  return Math.max(0, (ns - resolutionMs * 1e6) / 1e9);
}

/** The figures, by their standard names (prom-client's, which Node dashboards and alerts use). */
const FIGURES = [
  ['min', 'The minimum recorded event loop delay.'],
  ['max', 'The maximum recorded event loop delay.'],
  ['mean', 'The mean of the recorded event loop delays.'],
  ['stddev', 'The standard deviation of the recorded event loop delays.'],
  ['p50', 'The 50th percentile of the recorded event loop delays.'],
  ['p90', 'The 90th percentile of the recorded event loop delays.'],
  ['p99', 'The 99th percentile of the recorded event loop delays.'],
] as const;

type Figure = (typeof FIGURES)[number][0];

/** The names of the figures this replaces among prom-client's default metrics. */
export const EVENT_LOOP_DELAY_METRICS: readonly string[] = FIGURES.map(([figure]) => metricName(figure));

function metricName(figure: Figure): string {
  return `nodejs_eventloop_lag_${figure}_seconds`;
}

/**
 * How late the event loop ran since the last scrape: `nodejs_eventloop_lag_{min,max,mean,stddev,
 * p50,p90,p99}_seconds`, the delay beyond the monitor's own interval. Node's monitorEventLoopDelay
 * records the whole time between two ticks of its timer, so prom-client's figures read the
 * resolution on an idle loop (100 ms at ours, 10 ms at its default) and that much more under any
 * load; these are the same histogram less the resolution. Like prom-client's, the histogram starts
 * again at each scrape (Node then records from its next tick: the first 100 ms after a scrape are
 * not measured).
 */
export function registerEventLoopDelay(registry: prom.Registry, labels: Record<string, string>): void {
  const histogram = monitorEventLoopDelay({ resolution: EVENT_LOOP_DELAY_RESOLUTION_MS });
  histogram.enable();
  const beyond = (ns: number) => delayBeyondResolutionSeconds(ns, EVENT_LOOP_DELAY_RESOLUTION_MS);
  const read: Record<Figure, () => number> = {
    min: () => beyond(histogram.min),
    max: () => beyond(histogram.max),
    mean: () => beyond(histogram.mean),
    stddev: () => histogram.stddev / 1e9,
    p50: () => beyond(histogram.percentile(50)),
    p90: () => beyond(histogram.percentile(90)),
    p99: () => beyond(histogram.percentile(99)),
  };
  const takeAll = () => Object.fromEntries(FIGURES.map(([f]) => [f, read[f]()])) as Record<Figure, number>;
  let taken: Record<Figure, number> | undefined;
  for (const [figure, help] of FIGURES) {
    new prom.Gauge({
      name: metricName(figure),
      help,
      labelNames: Object.keys(labels),
      registers: [registry],
      // A scrape collects `min` first (registered first): it takes every figure and starts the
      // histogram again; the others give what it took. Before the timer's first tick there is none.
      collect(this: prom.Gauge) {
        if (figure === 'min') {
          taken = histogram.count === 0 ? undefined : takeAll();
          histogram.reset();
        }
        if (taken !== undefined) this.set(labels, taken[figure]);
      },
    });
  }
}
