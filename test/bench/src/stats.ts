import { delayBeyondResolutionSeconds } from '@infermesh/telemetry';
import { monitorEventLoopDelay } from 'node:perf_hooks';

/** The q-quantile (0..1) of samples, by nearest rank. */
export function quantile(samples: readonly number[], q: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[rank]!;
}

export function round(value: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/** Prints rows as an aligned text table. */
export function table(header: string[], rows: (string | number)[][]): string {
  const cells = [header, ...rows.map((r) => r.map(String))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => r[i]!.length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i]!)).join('  ');
  return [line(cells[0]!), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join('\n');
}

/** Rows as a markdown table under `header`. */
export function markdownTable(header: string[], rows: (string | number)[][]): string {
  const line = (cells: (string | number)[]) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

/** The tick of loopDelay's monitor. */
const LOOP_DELAY_RESOLUTION_MS = 1;

/**
 * How late this process's event loop runs from now until stopped: stop() gives its p50 and p99 in ms,
 * the delay beyond the monitor's own tick (delayBeyondResolutionSeconds).
 */
export function loopDelay(): { stop(): { p50: number; p99: number } } {
  const histogram = monitorEventLoopDelay({ resolution: LOOP_DELAY_RESOLUTION_MS });
  histogram.enable();
  const beyondTickMs = (ns: number) => round(delayBeyondResolutionSeconds(ns, LOOP_DELAY_RESOLUTION_MS) * 1000, 2);
  return {
    stop: () => {
      histogram.disable();
      return { p50: beyondTickMs(histogram.percentile(50)), p99: beyondTickMs(histogram.percentile(99)) };
    },
  };
}
