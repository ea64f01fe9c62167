import { buildMlpModel } from '@infermesh/model-builder';
import * as ort from 'onnxruntime-node';
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { SERVICE_NAMES } from '@infermesh/system';
import { metricIn, metricValue, startFixture } from '../../e2e/support/system-fixture';
import { serviceProcesses, type WarmUp, warmUp } from './closed-loop';
import { openLoop } from './open-loop';
import type { ProbeFigures } from './overload-probe';
import { LoadClient, seededRequests, serverLiveEvery, unary } from './raw-infer';
import { loopDelay, quantile, round, table } from './stats';

const FEATURES = 512;
const CONCURRENCIES = [1, 8, 32, 64, 128];
/** Each closed-loop point runs this long after its warm-up. */
const POINT_MS = 4_000;
const POINT_WARMUP_MS = 500;
/** The concurrency the system is warmed up at before the points (warmUp). */
const WARM_UP_CONCURRENCY = 64;
const OVERLOAD_MS = 5_000;
/** A request unanswered this long after the overload ends counts as never answered. */
const ANSWER_GRACE_MS = 15_000;
/**
 * The queue bound of the batched model: about four max-size batches, so that what waits is what the
 * worker clears in a few batch times. Overload beyond it is refused, not queued.
 */
const QUEUE_SIZE = 256;
/**
 * The ceiling of the gateway's adaptive concurrency limit (GATEWAY_CONCURRENCY_LIMIT=adaptive, the
 * default): about what it clears in half a second at this machine's capacity. The limit itself
 * follows the latency; the overload reports where it went.
 */
const GATEWAY_MAX_IN_FLIGHT = 512;
/** Of the overload's requests, those a client of its own sends each second (overload-probe.ts). */
const PROBE_RATE = 100;

interface Point {
  mode: 'on' | 'off';
  concurrency: number;
  throughput: number;
  p50: number;
  p99: number;
  errors: number;
  /** Process CPU time of each service per answered request. */
  cpu_us_per_req: Record<string, number>;
}

/**
 * Dynamic batching through the whole system (gateway gRPC, router, batcher, worker; result cache off
 * so every request computes): closed-loop throughput and latency at several concurrencies with
 * batching on and off, then an open-loop overload at twice the capacity measured with batching on.
 * The same MLP is registered twice: "mlp" batches (max batch size 64, the registry's default), "mlp-off"
 * has batching off (max_batch_size 0). The reference is the same model in-process.
 */
export async function batching(): Promise<Record<string, unknown>> {
  const model = buildMlpModel();
  const fixture = await startFixture({
    models: [
      { ...buildMlpModel({ name: 'mlp' }), batching: { maxQueueSize: QUEUE_SIZE } },
      { ...buildMlpModel({ name: 'mlp-off' }), batching: { maxBatchSize: 0, maxQueueSize: QUEUE_SIZE } },
    ],
    env: {
      ROUTER_CACHE_ENABLED: 'false',
      GATEWAY_MAX_IN_FLIGHT: String(GATEWAY_MAX_IN_FLIGHT),
      GATEWAY_LOG_LEVEL: 'warn',
      ROUTER_LOG_LEVEL: 'warn',
      BATCHER_LOG_LEVEL: 'warn',
    },
  });
  const gateway = new LoadClient(fixture.system.gatewayGrpcAddress);
  // Distinct inputs (the result cache is off: every one computes), each encoded by copying one
  // encoding: at twice the capacity, a client that built and encoded each request took most of a
  // core of this machine's two, which the system then lacked.
  const encoded = { mlp: seededRequests('mlp', [FEATURES]), 'mlp-off': seededRequests('mlp-off', [FEATURES]) };
  let counter = 0;
  const call = (name: keyof typeof encoded) => unary(gateway, encoded[name](counter++), 30_000);
  const rssMb = async (service: 'batcher') =>
    round(
      (await metricValue(fixture.system.metricsUrl(service), 'process_resident_memory_bytes', { service })) / 2 ** 20,
      1,
    );

  const cpuSeconds = async () =>
    Object.fromEntries(
      await Promise.all(
        SERVICE_NAMES.map(
          async (name) =>
            [
              name,
              await metricValue(fixture.system.metricsUrl(name), 'process_cpu_seconds_total', { service: name }),
            ] as const,
        ),
      ),
    );
  const points: Point[] = [];
  let inprocess: { b1: number; b64: number };
  let warm: WarmUp;
  let overload: Record<string, number>;
  /** The gateway's concurrency limit every 250 ms, from just before the overload until its last answer (the results file only). */
  const gatewayLimits: number[] = [];
  try {
    inprocess = await inProcessItemsPerSecond(model.bytes);
    // The system at its steady state before any point is measured (warmUp), both models alike.
    warm = await warmUp(WARM_UP_CONCURRENCY, (seed) => call(seed % 2 === 0 ? 'mlp' : 'mlp-off'));
    process.stdout.write(`warm-up: ${JSON.stringify(warm)}\n`);

    for (const concurrency of CONCURRENCIES) {
      // Alternating the order per concurrency spreads the machine's drift over both modes.
      const modes: ('on' | 'off')[] = concurrency % 2 === 0 ? ['on', 'off'] : ['off', 'on'];
      for (const mode of modes) {
        const cpuBefore = await cpuSeconds();
        const point = await closedLoop(() => call(mode === 'on' ? 'mlp' : 'mlp-off'), concurrency);
        const cpuAfter = await cpuSeconds();
        const cpu_us_per_req = Object.fromEntries(
          SERVICE_NAMES.map((name) => [name, round(((cpuAfter[name]! - cpuBefore[name]!) * 1e6) / point.answered, 0)]),
        );
        const { answered: _answered, ...measured } = point;
        points.push({ mode, concurrency, ...measured, cpu_us_per_req });
        process.stdout.write(
          `batching ${mode} c${concurrency}: ${round(point.throughput, 1)} req/s p50 ${round(point.p50, 2)} ms p99 ${round(point.p99, 2)} ms errors ${point.errors} CPU µs/req ${JSON.stringify(cpu_us_per_req)}\n`,
        );
      }
    }

    const best = points.filter((p) => p.mode === 'on').reduce((a, b) => (b.throughput > a.throughput ? b : a));
    const rate = 2 * best.throughput;
    /**
     * One scrape of the gateway: its memory, its concurrency limit, and how late its event loop ran
     * since the last scrape (each scrape starts that histogram again, so the gateway is scraped here
     * only).
     */
    const gatewaySample = async () => {
      const text = await (await fetch(fixture.system.metricsUrl('gateway'))).text();
      const labels = { service: 'gateway' };
      return {
        rssMb: round(metricIn(text, 'process_resident_memory_bytes', labels) / 2 ** 20, 1),
        limit: metricIn(text, 'infermesh_gateway_concurrency_limit'),
        loopP99Ms: metricIn(text, 'nodejs_eventloop_lag_p99_seconds', labels) * 1000,
        loopMaxMs: metricIn(text, 'nodejs_eventloop_lag_max_seconds', labels) * 1000,
      };
    };
    const before = await gatewaySample();
    const rssBefore = { batcher: await rssMb('batcher'), gateway: before.rssMb };
    const rssMax = { ...rssBefore };
    const gatewayLoopP99Ms: number[] = [];
    let gatewayLoopMaxMs = 0;
    const sampler = setInterval(() => {
      void Promise.all([rssMb('batcher'), gatewaySample()]).then(([b, g]) => {
        rssMax.batcher = Math.max(rssMax.batcher, b);
        rssMax.gateway = Math.max(rssMax.gateway, g.rssMb);
        gatewayLimits.push(g.limit);
        gatewayLoopP99Ms.push(g.loopP99Ms);
        gatewayLoopMaxMs = Math.max(gatewayLoopMaxMs, g.loopMaxMs);
      });
    }, 250);
    // What any answer of the gateway takes meanwhile: ServerLive, which does nothing, on a connection
    // of its own every 10 ms. A refusal cannot come back faster than this on this machine.
    const live = new LoadClient(fixture.system.gatewayGrpcAddress);
    const liveProbe = serverLiveEvery(live, 10);
    // How late this process's own event loop ran meanwhile: every latency above is measured through it.
    const clientLoop = loopDelay();
    const gatewayPid = serviceProcesses(fixture.system).find((p) => p.name === 'gateway')!.pid;
    const schedBefore = schedstat(gatewayPid);
    const probe = await startProbe(fixture.system.gatewayGrpcAddress, 'mlp', FEATURES, PROBE_RATE);
    const openStart = performance.now();
    const clientCpuBefore = process.cpuUsage();
    const open = await openLoop(() => call('mlp'), rate - PROBE_RATE, OVERLOAD_MS, ANSWER_GRACE_MS);
    const clientCpu = process.cpuUsage(clientCpuBefore);
    const openMs = performance.now() - openStart;
    const schedAfter = schedstat(gatewayPid);
    const probed = await probe.figures;
    const clientLoopMs = clientLoop.stop();
    clearInterval(sampler);
    const liveMs = liveProbe.stop();
    live.close();
    overload = {
      capacity_rps: round(best.throughput, 1),
      capacity_concurrency: best.concurrency,
      capacity_p99_ms: round(best.p99, 2),
      offered_rps: round(rate, 1),
      sent: open.sent,
      admitted: open.admitted.length,
      refused: open.refused.length,
      /** Of the refused, the streams the gateway's HTTP/2 server refused before the gateway saw them (see raw-infer.ts). */
      refused_streams: open.refusedStreams,
      other_errors: open.otherErrors,
      unanswered: open.unanswered,
      admitted_rps: round(open.admitted.length / (OVERLOAD_MS / 1000), 1),
      admitted_p50_ms: round(quantile(open.admitted, 0.5), 2),
      admitted_p99_ms: round(quantile(open.admitted, 0.99), 2),
      /** The same without the first second, while the gateway's limit adapts to the overload. */
      admitted_p99_ms_after_1s: round(quantile(open.admittedAfterFirstSecond, 0.99), 2),
      reject_p50_ms: round(quantile(open.refused, 0.5), 2),
      reject_p99_ms: round(quantile(open.refused, 0.99), 2),
      serverlive_p50_ms: round(quantile(liveMs, 0.5), 2),
      serverlive_p99_ms: round(quantile(liveMs, 0.99), 2),
      /**
       * The gateway's event loop's time on a CPU and waiting for one (runnable, not running) over the overload, per
       * second of it, and the mean wait each time it was put on a CPU (/proc/<pid>/schedstat).
       */
      gateway_cpu_ms_per_s: round((schedAfter.runNs - schedBefore.runNs) / 1e6 / (OVERLOAD_MS / 1000), 1),
      gateway_runqueue_wait_ms_per_s: round((schedAfter.waitNs - schedBefore.waitNs) / 1e6 / (OVERLOAD_MS / 1000), 1),
      gateway_runqueue_wait_ms_per_slice: round(
        (schedAfter.waitNs - schedBefore.waitNs) / 1e6 / Math.max(1, schedAfter.slices - schedBefore.slices),
        3,
      ),
      /** A process of its own that sent PROBE_RATE of the requests/s offered, and a ServerLive every 10 ms: what a client not itself saturated gets. */
      ...Object.fromEntries(Object.entries(probed).map(([k, v]) => [`probe_${k}`, v])),
      /** The benchmark's own event loop's lateness during the overload (the client's share of any latency above). */
      client_loop_delay_p50_ms: clientLoopMs.p50,
      client_loop_delay_p99_ms: clientLoopMs.p99,
      /** The benchmark's own CPU (the load it generates, and its measuring) a second, from the overload's start until its last answer. */
      client_cpu_ms_per_s: round((clientCpu.user + clientCpu.system) / openMs, 1),
      /** The gateway's: the p99 of each 250 ms, their median and their highest, and the longest delay. */
      gateway_loop_delay_p99_ms_median: round(quantile(gatewayLoopP99Ms, 0.5), 2),
      gateway_loop_delay_p99_ms_max: round(Math.max(...gatewayLoopP99Ms), 2),
      gateway_loop_delay_max_ms: round(gatewayLoopMaxMs, 2),
      batcher_rss_mb_before: rssBefore.batcher,
      batcher_rss_mb_max: rssMax.batcher,
      gateway_rss_mb_before: rssBefore.gateway,
      gateway_rss_mb_max: rssMax.gateway,
      /** The gateway's adaptive concurrency limit before the overload, and its range during it (sampled every 250 ms). */
      gateway_limit_before: before.limit,
      gateway_limit_min: Math.min(...gatewayLimits),
      gateway_limit_max: Math.max(...gatewayLimits),
      gateway_limit_last: gatewayLimits.at(-1) ?? Number.NaN,
    };
  } finally {
    gateway.close();
    await fixture.stop();
  }

  const at = (mode: 'on' | 'off', c: number) => points.find((p) => p.mode === mode && p.concurrency === c)!;
  process.stdout.write(
    `\n${table(
      ['concurrency', 'on req/s', 'off req/s', 'gain', 'on p50', 'off p50', 'on p99', 'off p99'],
      CONCURRENCIES.map((c) => [
        c,
        round(at('on', c).throughput, 1),
        round(at('off', c).throughput, 1),
        round(at('on', c).throughput / at('off', c).throughput, 2),
        round(at('on', c).p50, 2),
        round(at('off', c).p50, 2),
        round(at('on', c).p99, 2),
        round(at('off', c).p99, 2),
      ]),
    )}\n\noverload: ${JSON.stringify(overload)}\n`,
  );
  return {
    scenario: 'batching',
    model: 'mlp (FP32 512-2048-2048-512), 1 item per request, through gateway gRPC; result cache off',
    point_seconds: POINT_MS / 1000,
    queue_size: QUEUE_SIZE,
    gateway_max_in_flight: GATEWAY_MAX_IN_FLIGHT,
    /** What warmUp took before the first point: its duration, requests, and first and last throughput. */
    warmup: { s: round(warm.ms / 1000, 1), requests: warm.requests, first_rps: warm.firstRps, last_rps: warm.lastRps },
    gain_c64: round(at('on', 64).throughput / at('off', 64).throughput, 2),
    p99_on_le_off: CONCURRENCIES.filter((c) => c >= 8).every((c) => at('on', c).p99 <= at('off', c).p99),
    // The overload's own figures (refusals' p99, unanswered, …) come in `overload`, which the last line
    // flattens to overload_<figure>; only this ratio is derived here.
    overload_admitted_p99_ratio: round(overload.admitted_p99_ms! / overload.capacity_p99_ms!, 2),
    /** In-process onnxruntime-node, same model, same thread count as the worker, items/s. */
    inprocess_items_per_s: { b1: round(inprocess.b1, 1), b64: round(inprocess.b64, 1) },
    /** System throughput with batching on at concurrency 64 ÷ in-process at batch 64. */
    on_c64_over_inprocess_b64: round(at('on', 64).throughput / inprocess.b64, 3),
    points: points.map((p) => ({
      ...p,
      throughput: round(p.throughput, 1),
      p50: round(p.p50, 2),
      p99: round(p.p99, 2),
    })),
    overload,
    overload_gateway_limit_every_250ms: gatewayLimits,
  };
}

/** `concurrency` clients each sending its next request when the last is answered. */
async function closedLoop(
  send: () => Promise<unknown>,
  concurrency: number,
): Promise<Omit<Point, 'mode' | 'concurrency' | 'cpu_us_per_req'> & { answered: number }> {
  const latencies: number[] = [];
  let errors = 0;
  const start = performance.now();
  const measureFrom = start + POINT_WARMUP_MS;
  const end = measureFrom + POINT_MS;
  let completed = 0;
  let answered = 0;
  const client = async () => {
    while (performance.now() < end) {
      const t = performance.now();
      try {
        await send();
        answered += 1;
        if (t >= measureFrom) {
          latencies.push(performance.now() - t);
          completed += 1;
        }
      } catch {
        if (t >= measureFrom) errors += 1;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, client));
  // Requests that started in the window and finished after it count towards its throughput.
  const seconds = (Math.max(end, performance.now()) - measureFrom) / 1000;
  return {
    throughput: completed / seconds,
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
    errors,
    answered,
  };
}

/** The time a process's main thread (its event loop) spent on a CPU and waiting on a run queue (ns), and the times it was put on one. */
function schedstat(pid: number): { runNs: number; waitNs: number; slices: number } {
  const [runNs, waitNs, slices] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number);
  return { runNs: runNs!, waitNs: waitNs!, slices: slices! };
}

/**
 * Forks overload-probe.js and waits until it is connected; tells it to start. Its figures come once
 * its open loop of `rate` requests/s for OVERLOAD_MS has its answers.
 */
async function startProbe(
  address: string,
  model: string,
  features: number,
  rate: number,
): Promise<{ figures: Promise<ProbeFigures> }> {
  const child = fork(join(__dirname, 'overload-probe.js'), [
    address,
    model,
    String(features),
    String(rate),
    String(OVERLOAD_MS),
    String(ANSWER_GRACE_MS),
  ]);
  const exited = new Promise<never>((_, reject) =>
    child.once('exit', (code) => reject(new Error(`the overload probe exited with ${code} before its figures`))),
  );
  const message = () => Promise.race([new Promise<unknown>((resolve) => child.once('message', resolve)), exited]);
  await message();
  // Not awaited here: an async function's promise would wait for this one.
  const figures = message() as Promise<ProbeFigures>;
  child.send('go');
  return { figures };
}

/** The model in-process with the worker's default threads (cores ÷ 1 instance), at batch 1 and 64. */
async function inProcessItemsPerSecond(bytes: Uint8Array): Promise<{ b1: number; b64: number }> {
  const session = await ort.InferenceSession.create(bytes, { intraOpNumThreads: availableParallelism() });
  const rate = async (batch: number) => {
    const feeds = { input: new ort.Tensor('float32', new Float32Array(batch * FEATURES).fill(0.5), [batch, FEATURES]) };
    for (let i = 0; i < 5; i++) await session.run(feeds);
    let items = 0;
    const start = performance.now();
    while (performance.now() - start < 2_000) {
      await session.run(feeds);
      items += batch;
    }
    return items / ((performance.now() - start) / 1000);
  };
  try {
    return { b1: await rate(1), b64: await rate(64) };
  } finally {
    await session.release();
  }
}
