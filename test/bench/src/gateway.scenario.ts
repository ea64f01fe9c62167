import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { DataType } from '@infermesh/tensors';
import { startRedisServer } from '@infermesh/testing';
import { spawnSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { API_KEY, type Fixture, metricValue, startFixture } from '../../e2e/support/system-fixture';
import { quantile, round, table } from './stats';

/** Requests per path in one block; the paths take turns block by block. */
const BLOCK = 200;
const ROUNDS = 8;
const WARMUP_ROUNDS = 1;
/** Requests per CPU block, sent by CPU_CONCURRENCY clients so that the gateway is throughput-bound. */
const CPU_REQUESTS = 2_000;
const CPU_CONCURRENCY = 8;
/** CPU blocks per path, gRPC and REST alternating. */
const CPU_ROUNDS = 2;
const CPU_WARMUP_REQUESTS = 300;
const IDLE_WINDOW_MS = 3_000;
const TARGETS = { gateway_added_p50_ms: 0.3, gateway_cpu_us_per_req: 150 };

/** Rate limiting on for the configured key, with limits no request of this run reaches: the limiter decides every request. */
const RATE_LIMIT_ENV = { GATEWAY_RATE_LIMIT_RPS: '1000000', GATEWAY_RATE_LIMIT_BURST: '1000000' };
/** One input, sent again and again: after the first request the router answers it from its local cache. */
const INPUT = Float32Array.of(1, 2, 3, 4);

type PathName = 'grpc' | 'direct' | 'rest';

interface Variant {
  samples: Record<PathName, number[]>;
  /** Gateway process CPU µs per request (idle burn subtracted), and without the subtraction. */
  cpuUsPerReq: { grpc: number; rest: number };
  cpuUsPerReqRaw: { grpc: number; rest: number };
  idleCpuPercent: number;
  /** Answers not served from the router's cache (each path expects every measured answer to be). */
  uncached: number;
}

/**
 * What the gateway adds to a request, with authentication and rate limiting on: the `tiny` model with
 * the result cache on and one input repeated, so that the router answers from its local cache and
 * every path is hops, not compute. At concurrency 1, taking turns block by block in one run:
 * (a) gRPC ModelInfer through the gateway, (b) RouterService.Infer straight to the router with the
 * internal request the gateway would forward (tenant and routing key included), (c) REST JSON through
 * the gateway. Then the gateway process's CPU time (/proc/<pid>/stat) over blocks of requests at
 * concurrency 8, per request, gRPC and REST. Rate limits in the gateway's memory; then again with a
 * real redis-server as the shared rate-limit store, when one is on PATH.
 */
export async function gateway(): Promise<Record<string, unknown>> {
  const embedded = await measure(undefined);
  const redis = await measureWithRedis();

  const p = (v: Variant, path: PathName, q: number) => round(quantile(v.samples[path], q));
  const added = (v: Variant, path: 'grpc' | 'rest') =>
    round(quantile(v.samples[path], 0.5) - quantile(v.samples.direct, 0.5));
  const figures = (v: Variant) => ({
    grpc_p50_ms: p(v, 'grpc', 0.5),
    grpc_p99_ms: p(v, 'grpc', 0.99),
    direct_p50_ms: p(v, 'direct', 0.5),
    direct_p99_ms: p(v, 'direct', 0.99),
    rest_p50_ms: p(v, 'rest', 0.5),
    rest_p99_ms: p(v, 'rest', 0.99),
    gateway_added_p50_ms: added(v, 'grpc'),
    gateway_added_p50_ms_rest: added(v, 'rest'),
    gateway_cpu_us_per_req: v.cpuUsPerReq.grpc,
    gateway_cpu_us_per_req_rest: v.cpuUsPerReq.rest,
    gateway_cpu_us_per_req_raw: v.cpuUsPerReqRaw.grpc,
    gateway_cpu_us_per_req_rest_raw: v.cpuUsPerReqRaw.rest,
    gateway_idle_cpu_percent: v.idleCpuPercent,
    uncached_answers: v.uncached,
  });
  const redisFigures = 'samples' in redis ? figures(redis) : redis;
  const result = {
    scenario: 'gateway',
    model:
      'tiny (FP32 [1,4] -> [1,3]), one input repeated: answered from the router local result cache; auth and rate limiting on (limits never reached)',
    rounds: ROUNDS,
    block: BLOCK,
    requests_per_path: ROUNDS * BLOCK,
    concurrency: 1,
    cpu_requests_per_path: CPU_ROUNDS * CPU_REQUESTS,
    cpu_concurrency: CPU_CONCURRENCY,
    ...figures(embedded),
    gateway_added_p50_ms_redis: 'samples' in redis ? added(redis, 'grpc') : null,
    gateway_cpu_us_per_req_redis: 'samples' in redis ? redis.cpuUsPerReq.grpc : null,
    targets: TARGETS,
    met: {
      gateway_added_p50_ms: added(embedded, 'grpc') <= TARGETS.gateway_added_p50_ms,
      gateway_cpu_us_per_req: embedded.cpuUsPerReq.grpc <= TARGETS.gateway_cpu_us_per_req,
    },
    /** The same figures with Redis as the rate-limit store (REDIS_URL for the gateway, registry and cache). */
    redis: redisFigures,
  };

  const rows = (label: string, v: Variant) => [
    [`${label}: gRPC via gateway`, p(v, 'grpc', 0.5), p(v, 'grpc', 0.99), added(v, 'grpc'), v.cpuUsPerReq.grpc],
    [`${label}: RouterService.Infer direct`, p(v, 'direct', 0.5), p(v, 'direct', 0.99), 0, ''],
    [`${label}: REST via gateway`, p(v, 'rest', 0.5), p(v, 'rest', 0.99), added(v, 'rest'), v.cpuUsPerReq.rest],
  ];
  process.stdout.write(
    `${table(
      ['path', 'p50 ms', 'p99 ms', 'p50 − direct ms', 'gateway CPU µs / req'],
      [...rows('memory limiter', embedded), ...('samples' in redis ? rows('redis limiter', redis) : [])],
    )}\n`,
  );
  if (!('samples' in redis)) process.stdout.write(`\nredis variant skipped: ${redis.skipped}\n`);
  process.stdout.write(
    `\ntargets: gateway_added_p50_ms ${result.gateway_added_p50_ms} ≤ ${TARGETS.gateway_added_p50_ms} (${result.met.gateway_added_p50_ms ? 'met' : 'NOT met'}), ` +
      `gateway_cpu_us_per_req ${result.gateway_cpu_us_per_req} ≤ ${TARGETS.gateway_cpu_us_per_req} (${result.met.gateway_cpu_us_per_req ? 'met' : 'NOT met'})\n`,
  );
  return result;
}

/** The measurements with a redis-server of its own as the rate-limit store, or why there are none. */
async function measureWithRedis(): Promise<Variant | { skipped: string }> {
  let server: Awaited<ReturnType<typeof startRedisServer>>;
  try {
    server = await startRedisServer();
  } catch (error) {
    return { skipped: error instanceof Error ? error.message : String(error) };
  }
  try {
    return await measure(server.url);
  } finally {
    await server.stop();
  }
}

/** Starts the system (rate limits in memory, or in Redis at redisUrl) and measures every path in it. */
async function measure(redisUrl: string | undefined): Promise<Variant> {
  const label = redisUrl === undefined ? 'memory limiter' : 'redis limiter';
  const began = performance.now();
  const fixture = await startFixture({ models: ['tiny'], redisUrl, env: RATE_LIMIT_ENV });
  const started = performance.now();
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  const router = createClient(RouterService, fixture.system.grpcAddress('router'));
  const url = `${fixture.system.gatewayUrl}/v2/models/tiny/infer`;
  const authorization = `Bearer ${API_KEY}`;
  const headers = { authorization, 'content-type': 'application/json' };
  const metadata = { authorization };
  // The tenant the gateway gives a configured key (see ApiKeyAuth), and its routing key without x-routing-key.
  const tenant = `key:${createHash('sha256').update(API_KEY).digest('hex').slice(0, 32)}`;
  const raw = new Uint8Array(INPUT.buffer);
  const restBody = JSON.stringify({
    inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: Array.from(INPUT) }],
  });
  const grpcRequest = create(ModelInferRequestSchema, {
    modelName: 'tiny',
    inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
    rawInputContents: [raw],
  });

  /** Each path sends one request and says whether the router's cache answered it. */
  const paths: Record<PathName, () => Promise<boolean>> = {
    grpc: async () => {
      const response = await grpc.modelInfer(grpcRequest, { metadata, timeoutMs: 30_000 });
      return response.parameters['cached']?.parameterChoice.value === true;
    },
    direct: async () => {
      // What the gateway forwards: the internal request, the caller's tenant and routing key, a request id, a deadline.
      const response = await router.infer(
        {
          request: {
            modelName: 'tiny',
            inputs: [{ name: 'input', datatype: DataType.FP32, shape: [1n, 4n], data: raw }],
            tenant,
            routingKey: tenant,
          },
        },
        { metadata: { 'x-request-id': randomUUID() }, timeoutMs: 30_000 },
      );
      return response.response?.cached === true;
    },
    rest: async () => {
      const res = await fetch(url, { method: 'POST', headers, body: restBody });
      if (res.status !== 200) throw new Error(`REST answered ${res.status}: ${await res.text()}`);
      const body = (await res.json()) as { parameters?: { cached?: unknown } };
      return body.parameters?.cached === true;
    },
  };
  const names = Object.keys(paths) as PathName[];
  const samples: Record<PathName, number[]> = { grpc: [], direct: [], rest: [] };
  let uncached = 0;
  const cpuTotals = { grpc: 0, rest: 0 };
  let idlePerMs = 0;
  try {
    // The first answer fills the cache; later ones come from it.
    await paths.grpc();
    for (let r = 0; r < WARMUP_ROUNDS + ROUNDS; r++) {
      // Alternating the order per round spreads the machine's drift over every path.
      for (const name of r % 2 === 0 ? names : [...names].reverse()) {
        for (let i = 0; i < BLOCK; i++) {
          const start = performance.now();
          const cached = await paths[name]();
          const ms = performance.now() - start;
          if (r >= WARMUP_ROUNDS) {
            samples[name].push(ms);
            if (!cached) uncached += 1;
          }
        }
      }
    }

    const latencyDone = performance.now();
    const cpu = gatewayCpuSeconds(fixture);
    // What the gateway burns with no traffic (timers, health polls) is measured first and subtracted.
    const idleStart = await cpu();
    await new Promise((r) => setTimeout(r, IDLE_WINDOW_MS));
    idlePerMs = ((await cpu()) - idleStart) / IDLE_WINDOW_MS;
    await closedLoop(paths.grpc, CPU_WARMUP_REQUESTS);
    await closedLoop(paths.rest, CPU_WARMUP_REQUESTS);
    const busy = { grpc: 0, rest: 0 };
    for (let r = 0; r < CPU_ROUNDS; r++) {
      for (const name of r % 2 === 0 ? (['grpc', 'rest'] as const) : (['rest', 'grpc'] as const)) {
        const before = await cpu();
        const start = performance.now();
        await closedLoop(paths[name], CPU_REQUESTS);
        const ms = performance.now() - start;
        const seconds = (await cpu()) - before;
        cpuTotals[name] += seconds;
        busy[name] += seconds - idlePerMs * ms;
      }
    }
    const secs = (from: number, to: number) => round((to - from) / 1000, 1);
    process.stdout.write(
      `gateway ${label}: start ${secs(began, started)} s, latency blocks ${secs(started, latencyDone)} s, idle + CPU blocks ${secs(latencyDone, performance.now())} s\n`,
    );
    const perReq = (seconds: number) => round((Math.max(0, seconds) * 1e6) / (CPU_ROUNDS * CPU_REQUESTS), 1);
    return {
      samples,
      cpuUsPerReq: { grpc: perReq(busy.grpc), rest: perReq(busy.rest) },
      cpuUsPerReqRaw: { grpc: perReq(cpuTotals.grpc), rest: perReq(cpuTotals.rest) },
      idleCpuPercent: round(idlePerMs * 1000 * 100, 2),
      uncached,
    };
  } finally {
    grpc.close();
    router.close();
    await fixture.stop();
  }
}

/** `requests` requests sent by CPU_CONCURRENCY clients, each sending its next when the last is answered. */
async function closedLoop(send: () => Promise<unknown>, requests: number): Promise<void> {
  let sent = 0;
  const client = async () => {
    while (sent < requests) {
      sent += 1;
      await send();
    }
  };
  await Promise.all(Array.from({ length: CPU_CONCURRENCY }, client));
}

/**
 * The gateway process's CPU time (user + system), in seconds: from /proc/<pid>/stat, which costs the
 * gateway nothing, else (no /proc) from its process_cpu_seconds_total metric.
 */
function gatewayCpuSeconds(fixture: Fixture): () => Promise<number> {
  const pid = fixture.system.process('gateway').pid;
  const stat = `/proc/${pid}/stat`;
  let procReadable = pid !== undefined;
  try {
    readFileSync(stat, 'utf8');
  } catch {
    procReadable = false;
  }
  if (!procReadable) {
    return () => metricValue(fixture.system.metricsUrl('gateway'), 'process_cpu_seconds_total', { service: 'gateway' });
  }
  const ticks = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;
  return async () => {
    // The fields after "(comm)": state is the first, utime the 12th and stime the 13th.
    const text = readFileSync(stat, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / ticks;
  };
}
