import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildMlpModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { registerModel, waitForVersionsReady } from '@infermesh/system';
import { performance } from 'node:perf_hooks';
import { API_KEY, metricValue, startFixture } from '../../e2e/support/system-fixture';
import { cpuUs, serviceProcesses } from './closed-loop';
import { quantile, round, table } from './stats';

const FEATURES = 512;
const ROUNDS = 2_000;
const WARMUP = 100;
/** Calls of one path in a row, between two readings of the services' CPU. */
const BLOCK = 50;
/** Inputs answered from the cache: each is sent once before the measured rounds. */
const HOT_INPUTS = 16;

/**
 * The result cache and shadow traffic through the whole system, gRPC at concurrency 1, the MLP at
 * batch 1, the paths taking turns in blocks of BLOCK calls so that the machine's noise hits every
 * path alike:
 * - miss: a new input every time (the cache is asked, misses, and the model runs);
 * - hit: an input answered before (served from the cache);
 * - shadowed: a new input to a model whose rollout mirrors 100 % of its requests to a second version
 *   (the same MLP), against "miss" as the same request without a shadow;
 * - uncached: a new input to a model whose cache policy is off (the cache is not asked), against
 *   "miss": what asking the cache and missing adds to a request, in latency and in the services' CPU
 *   (from /proc, read around each block; the model's own CPU is in both).
 */
export async function cache(): Promise<Record<string, unknown>> {
  const fixture = await startFixture({
    models: [
      buildMlpModel({ name: 'mlp' }),
      buildMlpModel({ name: 'mlp-shadowed' }),
      buildMlpModel({ name: 'mlp-uncached' }),
    ],
  });
  const processes = serviceProcesses(fixture.system);
  const servicesCpuUs = () => processes.reduce((total, p) => total + cpuUs(p.pid), 0);
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
  const metadata = { authorization: `Bearer ${API_KEY}` };
  const input = (seed: number) => {
    const data = new Float32Array(FEATURES);
    for (let j = 0; j < FEATURES; j++) data[j] = Math.sin(seed * 0.37 + j);
    return new Uint8Array(data.buffer);
  };
  /** Whether the answer came from the cache. */
  const call = async (model: string, data: Uint8Array): Promise<boolean> => {
    const response = await grpc.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: model,
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, BigInt(FEATURES)] }],
        rawInputContents: [data],
      }),
      { metadata, timeoutMs: 30_000 },
    );
    return response.parameters['cached']?.parameterChoice.value === true;
  };
  const timed = async (run: () => Promise<boolean>) => {
    const start = performance.now();
    const ok = await run();
    return { ok, ms: performance.now() - start };
  };
  type Path = 'miss' | 'hit' | 'shadowed' | 'uncached';
  const paths: Path[] = ['miss', 'hit', 'shadowed', 'uncached'];
  const samples: Record<Path, number[]> = { miss: [], hit: [], shadowed: [], uncached: [] };
  const cpu: Record<Path, number> = { miss: 0, hit: 0, shadowed: 0, uncached: 0 };
  let wrongHits = 0;
  let shadowRequests = 0;
  try {
    // Version 1 keeps serving once version 2 is READY (the default version policy, latest 1, would drain it).
    await registry.updateModel({
      model: { name: 'models/mlp-shadowed', versionPolicy: { policy: { case: 'all', value: {} } } },
      updateMask: { paths: ['version_policy'] },
    });
    const second = await registerModel(registry, 'mlp-shadowed', '2', buildMlpModel({ name: 'mlp-shadowed' }).bytes);
    await waitForVersionsReady(registry, [second.name], 120_000);
    await registry.setRolloutPolicy({
      model: 'models/mlp-shadowed',
      policy: { stableVersion: '1', shadow: { version: '2', percent: 100 } },
    });
    await registry.setCachePolicy({ model: 'models/mlp-uncached', policy: { enabled: false } });
    await new Promise((r) => setTimeout(r, 1_500)); // past the router's resolve TTL
    const hot = Array.from({ length: HOT_INPUTS }, (_, i) => input(-1 - i));
    for (const data of hot) await call('mlp', data);

    let seed = 0;
    let hits = 0;
    const once: Record<Path, () => Promise<boolean>> = {
      miss: async () => !(await call('mlp', input(seed++))),
      hit: () => call('mlp', hot[hits++ % HOT_INPUTS]!),
      shadowed: async () => !(await call('mlp-shadowed', input(seed++))),
      uncached: async () => !(await call('mlp-uncached', input(seed++))),
    };
    for (let block = 0; block < (WARMUP + ROUNDS) / BLOCK; block++) {
      const measured = block >= WARMUP / BLOCK;
      // The paths take turns, each round starting with the next one.
      for (const path of paths.map((_, i) => paths[(i + block) % paths.length]!)) {
        const before = servicesCpuUs();
        for (let i = 0; i < BLOCK; i++) {
          const { ok, ms } = await timed(once[path]);
          if (!ok) wrongHits += 1;
          if (measured) samples[path].push(ms);
        }
        if (measured) cpu[path] += servicesCpuUs() - before;
      }
    }
    await new Promise((r) => setTimeout(r, 1_000));
    shadowRequests = await metricValue(fixture.system.metricsUrl('router'), 'infermesh_router_shadow_requests_total', {
      model: 'mlp-shadowed',
      outcome: 'ok',
    });
  } finally {
    grpc.close();
    registry.close();
    await fixture.stop();
  }

  const p = (list: number[], q: number) => round(quantile(list, q), 3);
  const result = {
    scenario: 'cache',
    model:
      'mlp (FP32 512-2048-2048-512, batch 1), gRPC through the gateway, concurrency 1; the router keeps hot answers in its own cache, before the embedded shared one',
    block: BLOCK,
    rounds: ROUNDS,
    miss_p50_ms: p(samples.miss, 0.5),
    miss_p99_ms: p(samples.miss, 0.99),
    hit_p50_ms: p(samples.hit, 0.5),
    hit_p99_ms: p(samples.hit, 0.99),
    shadowed_p50_ms: p(samples.shadowed, 0.5),
    shadowed_p99_ms: p(samples.shadowed, 0.99),
    hit_p50_over_miss_p50: round(quantile(samples.hit, 0.5) / quantile(samples.miss, 0.5), 3),
    shadow100_p50_overhead: round(quantile(samples.shadowed, 0.5) / quantile(samples.miss, 0.5), 3),
    uncached_p50_ms: p(samples.uncached, 0.5),
    uncached_p99_ms: p(samples.uncached, 0.99),
    /** What asking the cache and missing adds to a request's p50, against the same request to a model whose cache is off. */
    miss_added_p50_ms: round(quantile(samples.miss, 0.5) - quantile(samples.uncached, 0.5), 3),
    /** The six services' CPU a request, the model's included. */
    miss_cpu_us: round(cpu.miss / ROUNDS, 0),
    hit_cpu_us: round(cpu.hit / ROUNDS, 0),
    shadowed_cpu_us: round(cpu.shadowed / ROUNDS, 0),
    uncached_cpu_us: round(cpu.uncached / ROUNDS, 0),
    /** The services' CPU asking the cache and missing adds to a request (the lookup, the key, the store). */
    miss_added_cpu_us: round((cpu.miss - cpu.uncached) / ROUNDS, 0),
    miss_cpu_over_uncached: round(cpu.miss / cpu.uncached, 3),
    /** Answers whose cached flag was not what the path expects (a miss answered from the cache, or a hit that missed). */
    unexpected_cache_answers: wrongHits,
    /** Mirrored requests the shadow version answered (one per shadowed request, warm-up included). */
    shadow_requests_ok: shadowRequests,
  };
  process.stdout.write(
    `${table(
      ['path', 'p50 ms', 'p99 ms', 'p50 ÷ miss', 'services CPU µs'],
      [
        ['miss (model runs)', result.miss_p50_ms, result.miss_p99_ms, 1, result.miss_cpu_us],
        ['hit (from the cache)', result.hit_p50_ms, result.hit_p99_ms, result.hit_p50_over_miss_p50, result.hit_cpu_us],
        [
          'miss with a 100 % shadow',
          result.shadowed_p50_ms,
          result.shadowed_p99_ms,
          result.shadow100_p50_overhead,
          result.shadowed_cpu_us,
        ],
        [
          'cache off (not asked)',
          result.uncached_p50_ms,
          result.uncached_p99_ms,
          round(quantile(samples.uncached, 0.5) / quantile(samples.miss, 0.5), 3),
          result.uncached_cpu_us,
        ],
      ],
    )}\n`,
  );
  return result;
}
