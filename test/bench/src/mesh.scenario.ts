import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import type { System } from '@infermesh/system';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { API_KEY, type Fixture, REPO_ROOT, startFixture } from '../../e2e/support/system-fixture';
import { quantile, round, table } from './stats';

const CONCURRENCY = 16;
const PHASE_MS = 4_000;
const ROUNDS = 6;
/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
const TICKS_PER_S = 100;

/** CPU time (user + system) of a process so far, in microseconds. */
function cpuUs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) / TICKS_PER_S) * 1e6; // utime, stime (fields 14 and 15)
}

/** The pids of every service of a system. */
function pids(system: System): number[] {
  return system.allProcesses.map((p) => p.pid!);
}

interface Phase {
  latenciesMs: number[];
  failures: number;
  cpuUs: number;
}

/** Closed-loop load at CONCURRENCY through the gateway's gRPC for PHASE_MS: latencies, failures, and the CPU all services used. */
async function phase(fixture: Fixture, seedBase: number): Promise<Phase> {
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  const processes = pids(fixture.system);
  const cpuBefore = processes.map(cpuUs);
  const latenciesMs: number[] = [];
  let failures = 0;
  let seed = seedBase;
  const end = Date.now() + PHASE_MS;
  try {
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (Date.now() < end) {
          seed += 1;
          const start = performance.now();
          try {
            await grpc.modelInfer(
              create(ModelInferRequestSchema, {
                modelName: 'tiny',
                inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
                rawInputContents: [new Uint8Array(new Float32Array([seed, 1, 2, 3]).buffer)],
              }),
              { metadata: { authorization: `Bearer ${API_KEY}` }, timeoutMs: 10_000 },
            );
            latenciesMs.push(performance.now() - start);
          } catch {
            failures += 1;
          }
        }
      }),
    );
  } finally {
    grpc.close();
  }
  const cpu = processes.map(cpuUs).reduce((sum, after, i) => sum + after - cpuBefore[i]!, 0);
  return { latenciesMs, failures, cpuUs: cpu };
}

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
  const totals = Object.fromEntries((['static', 'xds', 'mtls'] as const).map((m) => [m, { latenciesMs: [] as number[], failures: 0, cpuUs: 0 }])) as Record<Mode, Phase>;
  try {
    systems.static = await startFixture({ models: ['tiny'], env });
    systems.xds = await startFixture({ models: ['tiny'], env, meshPolicyFile: policy });
    systems.mtls = await startFixture({ models: ['tiny'], env, meshPolicyFile: policy, mtls: {} });
    const modes = ['static', 'xds', 'mtls'] as const;
    for (const [i, mode] of modes.entries()) await phase(systems[mode]!, i * 1e6); // warm-up
    for (let r = 0; r < ROUNDS; r++) {
      // Each mode goes first, second and third equally often.
      const order = modes.map((_, i) => modes[(i + r) % modes.length]!);
      for (const [i, mode] of order.entries()) {
        const result = await phase(systems[mode]!, (r + 2) * 1e7 + i * 1e6);
        totals[mode].latenciesMs.push(...result.latenciesMs);
        totals[mode].failures += result.failures;
        totals[mode].cpuUs += result.cpuUs;
      }
    }
  } finally {
    for (const system of [systems.mtls, systems.xds, systems.static]) await system?.stop();
  }

  const of = (mode: Mode) => {
    const t = totals[mode];
    const requests = t.latenciesMs.length;
    return {
      requests,
      failures: t.failures,
      rps: round(requests / ((ROUNDS * PHASE_MS) / 1000), 1),
      p50: quantile(t.latenciesMs, 0.5),
      p99: quantile(t.latenciesMs, 0.99),
      cpuUsPerRequest: t.cpuUs / Math.max(1, requests),
    };
  };
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
