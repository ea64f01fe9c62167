import { join } from 'node:path';
import { type Fixture, REPO_ROOT, startFixture } from '../../e2e/support/system-fixture';
import { addPhase, emptyPhase, type Phase, phase, summarize, warmUpTiny } from './closed-loop';
import { round, table } from './stats';

const CONCURRENCY = 16;
const PHASE_MS = 4_000;
const ROUNDS = 6;

type Mode = 'static' | 'xds' | 'mtls';

/**
 * The mesh's cost: the six services with static addresses, the same six through the mesh (gateway →
 * router and router → cache/batcher over `xds:///`, the registry serving envoy/mesh.yaml), and the
 * mesh again with mutual TLS and authorization on every internal hop, all three running, measured in
 * rotating phases of closed-loop load at c=16 through the gateway's gRPC (the tiny model, a new input
 * every time, the router's own cache off), so that the machine's noise hits each alike. CPU per
 * request is all six services' CPU time from /proc over the requests served.
 */
export async function mesh(): Promise<Record<string, unknown>> {
  const env = { ROUTER_LOCAL_CACHE_ENABLED: 'false' };
  const policy = join(REPO_ROOT, 'envoy', 'mesh.yaml');
  const systems: Partial<Record<Mode, Fixture>> = {};
  const totals = Object.fromEntries((['static', 'xds', 'mtls'] as const).map((m) => [m, emptyPhase()])) as Record<
    Mode,
    Phase
  >;
  const load = { concurrency: CONCURRENCY, durationMs: PHASE_MS };
  try {
    systems.static = await startFixture({ models: ['tiny'], env });
    systems.xds = await startFixture({ models: ['tiny'], env, meshPolicyFile: policy });
    systems.mtls = await startFixture({ models: ['tiny'], env, meshPolicyFile: policy, mtls: {} });
    const modes = ['static', 'xds', 'mtls'] as const;
    for (const mode of modes) await warmUpTiny(systems[mode]!, CONCURRENCY); // each at its steady state
    for (let r = 0; r < ROUNDS; r++) {
      // Each mode goes first, second and third equally often.
      const order = modes.map((_, i) => modes[(i + r) % modes.length]!);
      for (const [i, mode] of order.entries()) {
        addPhase(totals[mode], await phase(systems[mode]!, (r + 2) * 1e7 + i * 1e6, load));
      }
    }
  } finally {
    for (const system of [systems.mtls, systems.xds, systems.static]) await system?.stop();
  }

  const of = (mode: Mode) => summarize(totals[mode], (ROUNDS * PHASE_MS) / 1000);
  const s = of('static');
  const x = of('xds');
  const m = of('mtls');
  const result = {
    scenario: 'mesh',
    model: `tiny, gRPC through the gateway, closed loop at c=${CONCURRENCY}, a new input every request, router cache off; ${ROUNDS} rotating phases of ${PHASE_MS / 1000} s per mode (static, xds, xds with mutual TLS)`,
    static_rps: s.rps,
    xds_rps: x.rps,
    mtls_rps: m.rps,
    static_p50_ms: round(s.p50, 3),
    xds_p50_ms: round(x.p50, 3),
    mtls_p50_ms: round(m.p50, 3),
    static_p99_ms: round(s.p99, 3),
    xds_p99_ms: round(x.p99, 3),
    mtls_p99_ms: round(m.p99, 3),
    static_cpu_us_per_request: round(s.cpuUsPerRequest, 1),
    xds_cpu_us_per_request: round(x.cpuUsPerRequest, 1),
    mtls_cpu_us_per_request: round(m.cpuUsPerRequest, 1),
    xds_over_static_cpu: round(x.cpuUsPerRequest / s.cpuUsPerRequest, 3),
    xds_over_static_p50: round(x.p50 / s.p50, 3),
    mtls_over_plain_cpu: round(m.cpuUsPerRequest / x.cpuUsPerRequest, 3),
    mtls_over_plain_p50: round(m.p50 / x.p50, 3),
    static_failures: s.failures,
    xds_failures: x.failures,
    mtls_failures: m.failures,
  };
  process.stdout.write(
    `${table(
      ['mode', 'requests/s', 'p50 ms', 'p99 ms', 'CPU µs/request (6 services)', 'failures'],
      [
        ['static', s.rps, result.static_p50_ms, result.static_p99_ms, result.static_cpu_us_per_request, s.failures],
        ['xds', x.rps, result.xds_p50_ms, result.xds_p99_ms, result.xds_cpu_us_per_request, x.failures],
        ['xds + mTLS', m.rps, result.mtls_p50_ms, result.mtls_p99_ms, result.mtls_cpu_us_per_request, m.failures],
      ],
    )}\n`,
  );
  return result;
}
