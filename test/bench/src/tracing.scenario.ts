import { type Fixture, startFixture } from '../../e2e/support/system-fixture';
import { addPhase, emptyPhase, type Phase, phase, summarize, warmUpTiny } from './closed-loop';
import { OtlpSink } from './otlp-sink';
import { quantile, round, table } from './stats';

const CONCURRENCY = 16;
/**
 * The load every mode gets: well under what the services serve traced on this machine (about 1,200
 * requests/s at c=16), so that each mode serves the same requests and CPU per request is not the
 * machine's saturation (at saturation a mode that costs more also serves fewer, differently).
 */
const RATE_PER_S = 500;
const PHASE_MS = 4_000;
const ROUNDS = 10;
/**
 * Span counts are read once no span has arrived for this long: longer than the batch span
 * processor's default 5 s between exports, so that what the services still queue has come in.
 */
const SETTLE_QUIET_MS = 6_000;
/** Services that keep tracing background work may never fall quiet; the counts are read after this at most. */
const SETTLE_MAX_MS = 20_000;

const MODES = ['off', 'sampled_100', 'sampled_1'] as const;
type Mode = (typeof MODES)[number];
type TracedMode = Exclude<Mode, 'off'>;
const RATIO: Record<TracedMode, string> = { sampled_100: '1', sampled_1: '0.01' };

/** Waits until none of the receivers has received a span for SETTLE_QUIET_MS, or SETTLE_MAX_MS passed. */
async function settle(receivers: readonly OtlpSink[]): Promise<void> {
  const total = async () => (await Promise.all(receivers.map((r) => r.spanCount()))).reduce((sum, n) => sum + n, 0);
  const deadline = Date.now() + SETTLE_MAX_MS;
  let last = await total();
  let quietSince = Date.now();
  while (Date.now() - quietSince < SETTLE_QUIET_MS && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    const now = await total();
    if (now !== last) {
      last = now;
      quietSince = Date.now();
    }
  }
}

/**
 * Tracing's cost: the six services untraced, the same six exporting every trace (parent-based
 * trace-id ratio 1) over OTLP http/protobuf, and again sampling 1 % of traces, all three running,
 * measured in rotating phases of closed-loop load at c=16 through the gateway's gRPC (the tiny model,
 * a new input every time, the router's own cache off), so that the machine's noise hits each alike.
 * CPU per request is all six services' CPU time from /proc over the requests served: it includes
 * recording and exporting spans, not the receiving (an OtlpSink per traced system, a process that
 * only counts). The ratios are the median of each round's (the three modes measured back to back),
 * the pooled ones over all rounds beside them. Spans per request are what each receiver got over
 * every request sent to its system, read once the exporters have flushed.
 */
export async function tracing(): Promise<Record<string, unknown>> {
  // The services inherit this process's environment: an OTEL_ variable here would trace the "off"
  // system or change the sampling of the others.
  const inherited = Object.keys(process.env).filter((name) => name.startsWith('OTEL_'));
  if (inherited.length > 0)
    throw new Error(
      `unset ${inherited.join(', ')}: the services inherit the benchmark's environment, so the modes would not be what they say`,
    );

  const base = { ROUTER_LOCAL_CACHE_ENABLED: 'false' };
  const receivers: Record<TracedMode, OtlpSink> = { sampled_100: new OtlpSink(), sampled_1: new OtlpSink() };
  const systems: Partial<Record<Mode, Fixture>> = {};
  const totals = Object.fromEntries(MODES.map((m) => [m, emptyPhase()])) as Record<Mode, Phase>;
  const sent = Object.fromEntries(MODES.map((m) => [m, 0])) as Record<Mode, number>;
  const spans: Record<TracedMode, number> = { sampled_100: 0, sampled_1: 0 };
  const roundRatios: Record<TracedMode, number[]> = { sampled_100: [], sampled_1: [] };
  const load = { concurrency: CONCURRENCY, durationMs: PHASE_MS, ratePerS: RATE_PER_S };
  const run = async (mode: Mode, seedBase: number): Promise<Phase> => {
    const result = await phase(systems[mode]!, seedBase, load);
    sent[mode] += result.latenciesMs.length + result.failures;
    return result;
  };
  try {
    for (const receiver of Object.values(receivers)) await receiver.start();
    systems.off = await startFixture({ models: ['tiny'], env: base });
    for (const mode of ['sampled_100', 'sampled_1'] as const) {
      systems[mode] = await startFixture({
        models: ['tiny'],
        env: {
          ...base,
          OTEL_EXPORTER_OTLP_ENDPOINT: receivers[mode].endpoint,
          OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
          OTEL_TRACES_SAMPLER_ARG: RATIO[mode],
        },
      });
    }
    for (const mode of MODES) await warmUpTiny(systems[mode]!, CONCURRENCY); // each at its steady state
    // Spans of the start-up (registering and loading the model) and of the warm-up are not counted.
    await settle(Object.values(receivers));
    for (const receiver of Object.values(receivers)) await receiver.clear();

    for (let r = 0; r < ROUNDS; r++) {
      // Each mode goes first, second and third equally often.
      const order = MODES.map((_, i) => MODES[(i + r) % MODES.length]!);
      const cpu: Partial<Record<Mode, number>> = {};
      for (const [i, mode] of order.entries()) {
        const result = await run(mode, (r + 2) * 1e7 + i * 1e6);
        addPhase(totals[mode], result);
        cpu[mode] = result.cpuUs / Math.max(1, result.latenciesMs.length);
      }
      // Each round's own ratios: the machine's drift (other tenants of the host) cancels within a round.
      roundRatios.sampled_100.push(cpu.sampled_100! / cpu.off!);
      roundRatios.sampled_1.push(cpu.sampled_1! / cpu.off!);
    }
    await settle(Object.values(receivers));
    spans.sampled_100 = await receivers.sampled_100.spanCount();
    spans.sampled_1 = await receivers.sampled_1.spanCount();
  } finally {
    for (const system of [systems.sampled_1, systems.sampled_100, systems.off]) await system?.stop();
    for (const receiver of Object.values(receivers)) await receiver.stop();
  }

  const of = (mode: Mode) => summarize(totals[mode], (ROUNDS * PHASE_MS) / 1000);
  const off = of('off');
  const all = of('sampled_100');
  const one = of('sampled_1');
  const spansPerRequest = (mode: TracedMode) => round(spans[mode] / Math.max(1, sent[mode]), 3);
  const result = {
    scenario: 'tracing',
    model: `tiny, gRPC through the gateway, ${RATE_PER_S} requests/s from ${CONCURRENCY} paced clients, a new input every request (the router's own cache off: the shared cache is looked up and stored every time); ${ROUNDS} rotating phases of ${PHASE_MS / 1000} s per mode (tracing off; OTLP http/protobuf with parentbased_traceidratio sampling 100 % and 1 %, to a counting receiver in a process of its own)`,
    off_rps: off.rps,
    sampled_100_rps: all.rps,
    sampled_1_rps: one.rps,
    off_p50_ms: round(off.p50, 3),
    sampled_100_p50_ms: round(all.p50, 3),
    sampled_1_p50_ms: round(one.p50, 3),
    off_p99_ms: round(off.p99, 3),
    sampled_100_p99_ms: round(all.p99, 3),
    sampled_1_p99_ms: round(one.p99, 3),
    off_cpu_us_per_request: round(off.cpuUsPerRequest, 1),
    sampled_100_cpu_us_per_request: round(all.cpuUsPerRequest, 1),
    sampled_1_cpu_us_per_request: round(one.cpuUsPerRequest, 1),
    cpu_ratio_100: round(quantile(roundRatios.sampled_100, 0.5), 3),
    cpu_ratio_1: round(quantile(roundRatios.sampled_1, 0.5), 3),
    cpu_ratio_100_pooled: round(all.cpuUsPerRequest / off.cpuUsPerRequest, 3),
    cpu_ratio_1_pooled: round(one.cpuUsPerRequest / off.cpuUsPerRequest, 3),
    cpu_ratio_100_rounds: roundRatios.sampled_100.map((r) => round(r, 3)).join(' '),
    cpu_ratio_1_rounds: roundRatios.sampled_1.map((r) => round(r, 3)).join(' '),
    p50_ratio_100: round(all.p50 / off.p50, 3),
    p50_ratio_1: round(one.p50 / off.p50, 3),
    spans_per_request_100: spansPerRequest('sampled_100'),
    spans_per_request_1: spansPerRequest('sampled_1'),
    off_failures: off.failures,
    sampled_100_failures: all.failures,
    sampled_1_failures: one.failures,
  };
  process.stdout.write(
    `${table(
      ['tracing', 'requests/s', 'p50 ms', 'p99 ms', 'CPU µs/request (6 services)', 'spans/request', 'failures'],
      [
        ['off', off.rps, result.off_p50_ms, result.off_p99_ms, result.off_cpu_us_per_request, '-', off.failures],
        [
          'sampling 100 %',
          all.rps,
          result.sampled_100_p50_ms,
          result.sampled_100_p99_ms,
          result.sampled_100_cpu_us_per_request,
          result.spans_per_request_100,
          all.failures,
        ],
        [
          'sampling 1 %',
          one.rps,
          result.sampled_1_p50_ms,
          result.sampled_1_p99_ms,
          result.sampled_1_cpu_us_per_request,
          result.spans_per_request_1,
          one.failures,
        ],
      ],
    )}\n`,
  );
  return result;
}
