import { fromBinary } from '@bufbuild/protobuf';
import { buildCnnModel, buildMlpModel, type BuiltModel, CNN_INPUT_SHAPE } from '@infermesh/model-builder';
import { ModelInferResponseSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import * as ort from 'onnxruntime-node';
import { type ChildProcess, fork } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Worker } from 'node:worker_threads';
import { performance } from 'node:perf_hooks';
import { metricIn, REPO_ROOT, startFixture } from '../../e2e/support/system-fixture';
import { addPhase, closedLoop, emptyPhase, type Phase, serviceProcesses, threadsCpuUs, warmUp } from './closed-loop';
import { workerSession } from './in-process';
import { INFER_PATH, LoadClient, seededRequests, unary } from './raw-infer';
import { markdownTable, quantile, round, table } from './stats';

/** The hops a tensor crosses from the caller to the model: caller → gateway → router → batcher → worker. */
const HOPS = 4;
const CONCURRENCY = [1, 16];
const PHASE_MS = 2_500;
/** Phases of each path per point, the real path and the floor alternating. */
const ROUNDS = 3;
const IN_PROCESS_RUNS = 400;
/** Round trips of a message to an idle thread (threadRoundTripP50Ms), each after this long idle. */
const THREAD_ROUND_TRIPS = 1_000;
const THREAD_IDLE_MS = 1;
/**
 * The model's own CPU in a worker: its execution threads', onnxruntime's operator threads included
 * (they take the name of the thread that starts them).
 */
const executionThreadsCpuUs = (pid: number) => threadsCpuUs(pid, 'WorkerThread');
/** Functions listed per service in the profile summary. */
const PROFILE_TOP = 8;
/** The concurrency each path is warmed up at (warmUp): the highest measured, which warms it soonest. */
const WARM_UP_CONCURRENCY = 16;
/** How long the profile summary loads each path at each point. */
const PROFILE_WINDOW_MS = 3_000;

interface Size {
  key: 'small' | 'large';
  model: string;
  /** The shape of one item. */
  item: readonly number[];
  /**
   * Whether a second floor runs beside the first, its hops passing on a deadline and a request id as
   * the services' calls do (echo-hop.server.ts, 'context'): how much of the chain's transport is what
   * each call must carry beside its bytes.
   */
  contextFloor: boolean;
}

const SIZES: Size[] = [
  { key: 'small', model: 'mlp', item: [512], contextFloor: true },
  { key: 'large', model: 'cnn', item: CNN_INPUT_SHAPE, contextFloor: false },
];

/**
 * The serving path against the transport it runs on (issue 16). For a small tensor (the demo MLP,
 * 2 KiB in) and a large one (the generated CNN, 3×48×192 FP32, 110 KiB in), at concurrency 1 and 16:
 * - the real path: closed-loop ModelInfer through the gateway's gRPC, batch 1, a new input every call
 *   (the caches are asked and miss), with the CPU every service used (from /proc), the worker's split
 *   into the model's own (its execution threads, onnxruntime's included) and the rest;
 * - the floor: the same request bytes through HOPS bare grpc-js hops, chained processes that pass the
 *   bytes on (echo-hop.server.ts), the last answering with as many bytes as the real answer has; for
 *   the small tensor also the context floor, whose hops pass on a deadline and a request id too;
 * - the same model in-process (onnxruntime-node with the worker's session settings): p50 at batch 1
 *   and CPU per item.
 * Each path is first brought to its steady state (warmUp; the services' warm-up is reported as
 * <size>_warmup_s, _requests, _first_rps and _last_rps). The real path and the floor then run in
 * alternating phases, so that the machine's noise hits both alike.
 * Per point: added_p50_ms (p50 through the path less the model's p50 in-process), chain_cpu_us (CPU
 * per request of all services less the model's own), floor_cpu_us and floor_p50_ms, and their
 * ratios. At c=1 also the worker's share, from its metrics: its calls' mean time, the model's
 * runs' in it, and the difference, what it spends around the model (worker_call_ms,
 * worker_compute_ms, worker_around_model_ms), beside a bare message round trip to an idle thread
 * (thread_round_trip_p50_ms), the least that handing a run to an execution thread and back costs
 * here; and the model in-process again, each run after as long asleep as the worker's model idles
 * between two requests at c=1 (model_idle_ms: p50 less its runs' mean), its p50 and CPU per item
 * (inprocess_after_idle_p50_ms, _cpu_us_per_item), and the path's p50 less that p50
 * (added_p50_over_idle_model_ms): where a model's run after idle takes longer than back to back (its
 * weights and the caches cold), what the path adds beyond that. Then, from profiles (--cpu-prof) of
 * another system and of another floor under the same load, where each service's main thread and each
 * bare hop's spent their time a request, and each service's top self-time functions, written beside
 * the results as path.profile.md (profileSummary, with its figures).
 */
export async function path(): Promise<Record<string, unknown>> {
  const intraOpThreads = availableParallelism();
  const cnn = { ...buildCnnModel(), name: 'cnn' };
  const env = { WORKER_INSTANCES_PER_MODEL: '1', WORKER_INTRA_OP_THREADS: String(intraOpThreads) };
  const figures: Record<string, number> = {};
  const rows: (string | number)[][] = [];
  const cpuRows: (string | number)[][] = [];
  const contextRows: (string | number)[][] = [];
  /** The length of each size's answer, which the floor's last hop answers with. */
  const answerBytes = {} as Record<Size['key'], number>;
  const fixture = await startFixture({ models: ['mlp', cnn], env });
  const hops: ChildProcess[] = [];
  try {
    const gateway = new LoadClient(fixture.system.gatewayGrpcAddress);
    for (const size of SIZES) {
      const withSeed = seededRequests(size.model, size.item);
      const real = (seed: number) => unary(gateway, withSeed(seed));
      const answer = fromBinary(ModelInferResponseSchema, await real(0));
      if (answer.outputs.length !== 1) throw new Error(`${size.model} answered ${answer.outputs.length} outputs`);
      answerBytes[size.key] = (await real(1)).length;

      const floorChain = await startChain(answerBytes[size.key], 'bare');
      hops.push(...floorChain);
      const floorClient = new LoadClient(`127.0.0.1:${floorChain.at(-1)!.port}`);
      const floor = (seed: number) => unary(floorClient, withSeed(seed));
      const floorProcesses = floorChain.map((h, i) => ({ name: `hop${i}`, pid: h.pid! }));
      const contextChain = size.contextFloor ? await startChain(answerBytes[size.key], 'context') : [];
      hops.push(...contextChain);
      const contextClient = size.contextFloor ? new LoadClient(`127.0.0.1:${contextChain.at(-1)!.port}`) : undefined;
      const contextFloor = (seed: number) => unary(contextClient!, withSeed(seed));
      const contextProcesses = contextChain.map((h, i) => ({ name: `hop${i}`, pid: h.pid! }));
      const inProcess = await measureInProcess(size, intraOpThreads);
      // Every path at its steady state before any is measured (warmUp): what it took the services.
      const warm = await warmUp(WARM_UP_CONCURRENCY, real);
      figures[`${size.key}_warmup_s`] = round(warm.ms / 1000, 1);
      figures[`${size.key}_warmup_requests`] = warm.requests;
      figures[`${size.key}_warmup_first_rps`] = warm.firstRps;
      figures[`${size.key}_warmup_last_rps`] = warm.lastRps;
      await warmUp(WARM_UP_CONCURRENCY, floor);
      if (contextClient !== undefined) await warmUp(WARM_UP_CONCURRENCY, contextFloor);

      for (const concurrency of CONCURRENCY) {
        const load = { concurrency, durationMs: PHASE_MS };
        const totals = { real: emptyPhase(), floor: emptyPhase(), context: emptyPhase(), modelUs: 0 };
        const worker = fixture.system.workerProcess(0).pid!;
        // Warm-up of both.
        await closedLoop([], 1e6, { concurrency, durationMs: 1_000 }, real);
        await closedLoop([], 1e6, { concurrency, durationMs: 1_000 }, floor);
        if (contextClient !== undefined) await closedLoop([], 1e6, { concurrency, durationMs: 1_000 }, contextFloor);
        // The worker's share is read at c=1 only, where each of its calls is one run of the model.
        const workerBefore = concurrency === 1 ? await workerTimes(fixture.system.workerMetricsUrl(0)) : undefined;
        for (let r = 0; r < ROUNDS; r++) {
          const modelBefore = executionThreadsCpuUs(worker);
          const phase = await closedLoop(
            serviceProcesses(fixture.system),
            (r + 2) * 1e7 + concurrency * 1e5,
            load,
            real,
          );
          totals.modelUs += executionThreadsCpuUs(worker) - modelBefore;
          addPhase(totals.real, phase);
          addPhase(totals.floor, await closedLoop(floorProcesses, 0, load, floor));
          if (contextClient !== undefined)
            addPhase(totals.context, await closedLoop(contextProcesses, 0, load, contextFloor));
        }
        const key = `${size.key}_c${concurrency}`;
        const workerSpent =
          workerBefore && workerTimesBetween(workerBefore, await workerTimes(fixture.system.workerMetricsUrl(0)));
        const p50 = quantile(totals.real.latenciesMs, 0.5);
        const requests = totals.real.latenciesMs.length;
        const floorRequests = totals.floor.latenciesMs.length;
        const chainCpuUs = (totals.real.cpuUs - totals.modelUs) / requests;
        const floorCpuUs = totals.floor.cpuUs / floorRequests;
        const floorP50 = quantile(totals.floor.latenciesMs, 0.5);
        // At c=1 the model runs once a request, idle while the request crosses the other hops: the
        // same model in-process, each run after as long asleep, is what it costs the worker cold.
        const idleMs = workerSpent && Math.max(0, p50 - workerSpent.computeMs);
        const afterIdle = idleMs === undefined ? undefined : await measureInProcess(size, intraOpThreads, idleMs);
        const point = {
          requests_per_s: round(requests / ((ROUNDS * PHASE_MS) / 1000), 1),
          failures: totals.real.failures + totals.floor.failures + totals.context.failures,
          p50_ms: round(p50),
          p99_ms: round(quantile(totals.real.latenciesMs, 0.99)),
          inprocess_p50_ms: round(inProcess.p50Ms),
          added_p50_ms: round(p50 - inProcess.p50Ms),
          floor_p50_ms: round(floorP50),
          added_p50_over_floor: round((p50 - inProcess.p50Ms) / floorP50),
          model_cpu_us: round(totals.modelUs / requests, 1),
          inprocess_cpu_us_per_item: round(inProcess.cpuUsPerItem, 1),
          chain_cpu_us: round(chainCpuUs, 1),
          floor_cpu_us: round(floorCpuUs, 1),
          chain_cpu_over_floor: round(chainCpuUs / floorCpuUs),
          ...(workerSpent && {
            worker_call_ms: round(workerSpent.callMs),
            worker_compute_ms: round(workerSpent.computeMs),
            worker_around_model_ms: round(workerSpent.callMs - workerSpent.computeMs),
          }),
          ...(afterIdle && {
            model_idle_ms: round(idleMs!),
            inprocess_after_idle_p50_ms: round(afterIdle.p50Ms),
            inprocess_after_idle_cpu_us_per_item: round(afterIdle.cpuUsPerItem, 1),
            added_p50_over_idle_model_ms: round(p50 - afterIdle.p50Ms),
          }),
        };
        const context =
          contextClient === undefined ? undefined : contextFloorFigures(chainCpuUs, floorCpuUs, totals.context);
        for (const [name, value] of Object.entries({ ...point, ...context })) figures[`${key}_${name}`] = value;
        for (const [service, us] of Object.entries(totals.real.cpuUsByName)) {
          figures[`${key}_cpu_us_${service}`] = round((service === 'worker' ? us - totals.modelUs : us) / requests, 1);
        }
        rows.push([
          key,
          point.requests_per_s,
          point.p50_ms,
          point.p99_ms,
          point.inprocess_p50_ms,
          point.added_p50_ms,
          point.floor_p50_ms,
          point.added_p50_over_floor,
          point.chain_cpu_us,
          point.floor_cpu_us,
          point.chain_cpu_over_floor,
          point.failures,
        ]);
        if (context !== undefined)
          contextRows.push([
            key,
            point.floor_cpu_us,
            context.context_floor_cpu_us,
            context.context_floor_over_floor,
            point.chain_cpu_us,
            context.chain_cpu_over_context_floor,
          ]);
        cpuRows.push([
          key,
          ...['gateway', 'router', 'batcher', 'worker', 'cache', 'registry'].map(
            (s) => figures[`${key}_cpu_us_${s}`] ?? 0,
          ),
          point.model_cpu_us,
          point.inprocess_cpu_us_per_item,
        ]);
      }
      floorClient.close();
      contextClient?.close();
    }
    gateway.close();
  } finally {
    for (const hop of hops) hop.disconnect();
    await fixture.stop();
  }
  process.stdout.write(
    `${table(['point', 'req/s', 'p50 ms', 'p99 ms', 'in-process p50', 'added p50', 'floor p50', 'added/floor', 'chain CPU µs', 'floor CPU µs', 'chain/floor', 'failures'], rows)}\n\n`,
  );
  process.stdout.write(
    `${table(['CPU µs a request', 'gateway', 'router', 'batcher', 'worker', 'cache', 'registry', 'model (worker)', 'model in-process'], cpuRows)}\n\n`,
  );

  process.stdout.write(
    `${table(['point', 'floor CPU µs', 'context floor CPU µs', 'context/floor', 'chain CPU µs', 'chain/context floor'], contextRows)}\n\n`,
  );

  figures['thread_round_trip_p50_ms'] = round(await threadRoundTripP50Ms());
  process.stdout.write(
    `At c=1, the worker's calls (from its metrics, means): ${SIZES.map((size) => `${size.key} ${figures[`${size.key}_c1_worker_call_ms`]} ms, the model computing ${figures[`${size.key}_c1_worker_compute_ms`]} of it`).join('; ')}. A message's round trip to an idle thread: ${figures['thread_round_trip_p50_ms']} ms at p50.\n`,
  );
  process.stdout.write(
    `The model in-process at batch 1, back to back and each run after as long asleep as the worker's model between requests at c=1: ${SIZES.map((size) => `${size.key} ${figures[`${size.key}_c1_inprocess_p50_ms`]} and ${figures[`${size.key}_c1_inprocess_after_idle_p50_ms`]} ms at p50 (${figures[`${size.key}_c1_model_idle_ms`]} ms asleep), the path adding ${figures[`${size.key}_c1_added_p50_over_idle_model_ms`]} ms to the latter`).join('; ')}.\n\n`,
  );

  const profile = await profileSummary(cnn, env, answerBytes);
  writeFileSync(join(REPO_ROOT, 'test', 'bench', 'results', 'path.profile.md'), profile.markdown);
  process.stdout.write(`${profile.markdown}\n`);
  Object.assign(figures, profile.figures);
  // What chain ÷ floor would be if the services' own code cost nothing: the measured ratio less the
  // share of the services' time their own code took in the profile.
  for (const key of SIZES.flatMap((size) => CONCURRENCY.map((concurrency) => `${size.key}_c${concurrency}`))) {
    figures[`${key}_chain_cpu_over_floor_less_own_code`] = round(
      figures[`${key}_chain_cpu_over_floor`]! * (1 - figures[`${key}_profile_own_code_share`]!),
    );
  }
  return { scenario: 'path', hops: HOPS, phase_ms: PHASE_MS, rounds: ROUNDS, ...figures };
}

/**
 * The context floor's figures of a point: its CPU per request, the chain's over it, and it over the
 * bare floor (what carrying a deadline and a request id costs the hops).
 */
function contextFloorFigures(chainCpuUs: number, floorCpuUs: number, context: Phase) {
  const contextCpuUs = context.cpuUs / context.latenciesMs.length;
  return {
    context_floor_cpu_us: round(contextCpuUs, 1),
    context_floor_over_floor: round(contextCpuUs / floorCpuUs),
    chain_cpu_over_context_floor: round(chainCpuUs / contextCpuUs),
  };
}

/**
 * HOPS echo-hop processes chained, the last answering `answerBytes`; the first (the caller's) last in
 * the list. 'context': each hop passes on a deadline and a request id (echo-hop.server.ts). Each
 * process runs with `execArgv` beside Node's own (--cpu-prof for the profile summary).
 */
async function startChain(
  answerBytes: number,
  mode: 'bare' | 'context',
  execArgv: readonly string[] = [],
): Promise<(ChildProcess & { port: number })[]> {
  const chain: (ChildProcess & { port: number })[] = [];
  let next = '-';
  for (let i = 0; i < HOPS; i++) {
    const hop = fork(join(__dirname, 'echo-hop.server.js'), [INFER_PATH, next, String(answerBytes), mode], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      execArgv: [...process.execArgv, ...execArgv],
    }) as ChildProcess & { port: number };
    const [{ port }] = (await once(hop, 'message')) as [{ port: number }];
    hop.port = port;
    chain.push(hop);
    next = `127.0.0.1:${port}`;
  }
  return chain;
}

/**
 * The model in-process with the worker's session settings: p50 of a batch-1 run and CPU per item,
 * the runs back to back, or each after `idleMs` with this thread asleep (as the worker's model is
 * between two requests at c=1, while the request crosses the other hops).
 */
async function measureInProcess(
  size: Size,
  intraOpThreads: number,
  idleMs = 0,
): Promise<{ p50Ms: number; cpuUsPerItem: number }> {
  const bytes = size.model === 'mlp' ? buildMlpModel().bytes : buildCnnModel().bytes;
  const session = await workerSession(bytes, intraOpThreads);
  try {
    const feeds = {
      input: new ort.Tensor('float32', new Float32Array(size.item.reduce((a, b) => a * b, 1)).fill(1), [
        1,
        ...size.item,
      ]),
    };
    for (let i = 0; i < 20; i++) await session.run(feeds);
    const latencies: number[] = [];
    const cpu = process.cpuUsage();
    const asleep = new Int32Array(new SharedArrayBuffer(4));
    for (let i = 0; i < IN_PROCESS_RUNS; i++) {
      if (idleMs > 0) Atomics.wait(asleep, 0, 0, idleMs);
      const start = performance.now();
      await session.run(feeds);
      latencies.push(performance.now() - start);
    }
    const used = process.cpuUsage(cpu);
    return { p50Ms: quantile(latencies, 0.5), cpuUsPerItem: (used.user + used.system) / IN_PROCESS_RUNS };
  } finally {
    await session.release();
  }
}

interface WorkerTimes {
  /** The worker's Infer calls, each from its request whole to its answer sent (grpc_server_handling_seconds). */
  callS: number;
  calls: number;
  /** Its runs of the model on its execution threads, timed there (inference_compute_seconds). */
  computeS: number;
  runs: number;
}

/** The worker's counts of its calls and of its model's runs, from one scrape of its metrics. */
async function workerTimes(metricsUrl: string): Promise<WorkerTimes> {
  const text = await (await fetch(metricsUrl)).text();
  const infer = { method: 'WorkerService/Infer' };
  return {
    callS: metricIn(text, 'infermesh_worker_grpc_server_handling_seconds_sum', infer),
    calls: metricIn(text, 'infermesh_worker_grpc_server_handling_seconds_count', infer),
    computeS: metricIn(text, 'infermesh_worker_inference_compute_seconds_sum'),
    runs: metricIn(text, 'infermesh_worker_inference_compute_seconds_count'),
  };
}

/**
 * Between two scrapes, the mean time of the worker's calls and of its model's runs: at c=1, each call
 * one run, what the worker spends around the model (decoding, handing the run to an execution thread
 * and taking its answer back, encoding) is their difference.
 */
function workerTimesBetween(before: WorkerTimes, after: WorkerTimes): { callMs: number; computeMs: number } {
  if (after.calls === before.calls || after.runs === before.runs) {
    throw new Error(
      `the worker's metrics counted ${after.calls - before.calls} Infer calls and ${after.runs - before.runs} runs of the model over the phases: their names (grpc_server_handling_seconds{method="WorkerService/Infer"}, inference_compute_seconds) no longer match`,
    );
  }
  return {
    callMs: (1000 * (after.callS - before.callS)) / (after.calls - before.calls),
    computeMs: (1000 * (after.computeS - before.computeS)) / (after.runs - before.runs),
  };
}

/**
 * A message's round trip to a thread of this process that echoes it, each after THREAD_IDLE_MS idle
 * (the thread asleep, as a worker's execution thread is between requests at c=1), p50: what no hand-off
 * of a run to another thread and back goes below on this machine.
 */
async function threadRoundTripP50Ms(): Promise<number> {
  const echo = new Worker(
    "const { parentPort } = require('node:worker_threads'); parentPort.on('message', (m) => parentPort.postMessage(m));",
    { eval: true },
  );
  try {
    const latencies: number[] = [];
    for (let i = 0; i < THREAD_ROUND_TRIPS + 20; i++) {
      await sleep(THREAD_IDLE_MS);
      const start = performance.now();
      const answered = once(echo, 'message');
      echo.postMessage(i);
      await answered;
      if (i >= 20) latencies.push(performance.now() - start);
    }
    return quantile(latencies, 0.5);
  } finally {
    await echo.terminate();
  }
}

/** A profiled window of closed-loop load: when it ran (on the profiles' clock) and the calls it answered. */
interface ProfiledWindow extends Window {
  requests: number;
}

/** A point of the profile summary: one size at one concurrency, through the services and through the floor. */
interface ProfiledPoint {
  key: string;
  size: Size;
  concurrency: number;
  real: ProfiledWindow;
  floor: ProfiledWindow;
}

/** The busy time of a main thread within a point's window by area, and in all, in µs a request. */
type AreaUs = Record<Area | 'busy', number>;

/** A main thread's busy time within `window` by area, in µs a request answered meanwhile. */
function perRequest(profile: CpuProfile, window: ProfiledWindow): AreaUs {
  const { busyUs, us } = timeByArea(profile, window);
  const row = { busy: busyUs / window.requests } as AreaUs;
  for (const area of AREAS) row[area] = us[area] / window.requests;
  return row;
}

/** Several main threads' µs a request together. */
function sum(rows: readonly AreaUs[]): AreaUs {
  const total = { busy: 0, ...Object.fromEntries(AREAS.map((a) => [a, 0])) } as AreaUs;
  for (const row of rows) for (const k of Object.keys(total) as (keyof AreaUs)[]) total[k] += row[k];
  return total;
}

/**
 * Where each service's main thread spends its time (--cpu-prof), against the floor's hops under the
 * same load: a system of its own and, for each size, a chain of bare hops (startChain), all started
 * with profiling on and stopped so that the profiles are written. Each size at each concurrency
 * runs PROFILE_WINDOW_MS through the services, then as long through the floor, each path warm
 * (warmUp). Returns, as markdown, per point the µs a request each service's main thread and each
 * hop's took by area (see AREAS), and each service's top self-time functions; and as figures, per
 * point:
 * - profile_chain_us and profile_floor_us: all services' busy main threads a request, and all hops';
 * - profile_own_code_us and profile_own_code_share: the services' own code a request, all services
 *   together, and its share of their busy time;
 * - profile_transport_share: the transport's share of the services' busy time (grpc-js, Node's
 *   HTTP/2 and streams, native code).
 * Profiling slows every process, the services more than the hops (their requests/s are in the
 * summary's headings): the shares compare, the µs only within one point.
 */
async function profileSummary(
  cnn: BuiltModel,
  env: Record<string, string>,
  answerBytes: Record<Size['key'], number>,
): Promise<{ markdown: string; figures: Record<string, number> }> {
  const dir = mkdtempSync(join(tmpdir(), 'infermesh-path-profile-'));
  const profiling = [`--cpu-prof`, `--cpu-prof-dir=${dir}`];
  const points: ProfiledPoint[] = [];
  const fixture = await startFixture({ models: ['mlp', cnn], env: { ...env, NODE_OPTIONS: profiling.join(' ') } });
  const names = new Map(serviceProcesses(fixture.system).map((p) => [p.pid, p.name]));
  const chains: ChildProcess[] = [];
  /** The size each floor hop carries, by pid. */
  const sizeOfHop = new Map<number, Size['key']>();
  try {
    const gateway = new LoadClient(fixture.system.gatewayGrpcAddress);
    await unary(gateway, seededRequests(SIZES[0]!.model, SIZES[0]!.item)(0)); // connections open before the windows
    for (const size of SIZES) {
      const withSeed = seededRequests(size.model, size.item);
      const chain = await startChain(answerBytes[size.key], 'bare', profiling);
      chains.push(...chain);
      // The first hop, the one the caller calls, is the last started.
      for (const [i, hop] of chain.entries()) {
        names.set(hop.pid!, `floor hop ${HOPS - i}`);
        sizeOfHop.set(hop.pid!, size.key);
      }
      const floorClient = new LoadClient(`127.0.0.1:${chain.at(-1)!.port}`);
      const paths = {
        real: (seed: number) => unary(gateway, withSeed(seed)),
        floor: (seed: number) => unary(floorClient, withSeed(seed)),
      };
      // Profiled at their steady state.
      await warmUp(WARM_UP_CONCURRENCY, paths.real);
      await warmUp(WARM_UP_CONCURRENCY, paths.floor);
      for (const concurrency of CONCURRENCY) {
        const window = async (call: (seed: number) => Promise<Buffer>): Promise<ProfiledWindow> => {
          const from = monotonicUs();
          const load = { concurrency, durationMs: PROFILE_WINDOW_MS };
          const phase = await closedLoop([], (points.length + 1) * 1e7, load, call);
          return { from, to: monotonicUs(), requests: phase.latenciesMs.length };
        };
        const key = `${size.key}_c${concurrency}`;
        points.push({ key, size, concurrency, real: await window(paths.real), floor: await window(paths.floor) });
      }
      floorClient.close();
    }
    gateway.close();
  } finally {
    // A hop writes its profile as it exits.
    const exits = chains
      .filter((hop) => hop.exitCode === null)
      .map((hop) => {
        const exited = once(hop, 'exit');
        hop.disconnect();
        return exited;
      });
    await Promise.all(exits);
    await fixture.stop();
  }
  const services = ['gateway', 'router', 'batcher', 'worker', 'cache', 'registry'];
  const profiles = readdirSync(dir)
    .flatMap((file) => {
      // CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile; thread 0 is the main thread.
      const [, , , pid, thread] = file.split('.');
      const name = names.get(Number(pid));
      return name === undefined || thread !== '0'
        ? []
        : [{ name, pid: Number(pid), profile: JSON.parse(readFileSync(join(dir, file), 'utf8')) as CpuProfile }];
    })
    .sort((a, b) => rank(a.name) - rank(b.name));
  function rank(name: string): number {
    return services.includes(name) ? services.indexOf(name) : services.length + Number(name.split(' ').at(-1));
  }
  rmSync(dir, { recursive: true, force: true });

  const figures: Record<string, number> = {};
  const lines = [
    '# Path benchmark: where each service spends its CPU, against a bare hop',
    '',
    `From each service's main thread and each of the floor's hops' (\`--cpu-prof\`), the samples taken during ${PROFILE_WINDOW_MS / 1000} s of closed-loop load through the gateway's gRPC, then as long through the floor (${HOPS} bare grpc-js hops carrying the same bytes), each warm, for each tensor at c=${CONCURRENCY.join(' and c=')}; written by \`npm run bench -- path\`.`,
    '',
    `Busy time is split by area: ${AREAS.map((a) => `**${a}**: ${AREA_MEANING[a]}`).join('; ')}. Transport is ${TRANSPORT.join(' + ')}.`,
    '',
    "Busy is the time a main thread was not idle in the profile: its CPU time, and the time it waited for a CPU meanwhile (two cores for all the processes; the services, more of them, wait longer). Own code % and transport % are shares of the services' busy time. Profiling slows every process, the services more than the hops (the requests each path answered are in each point's heading): the shares compare across points, the µs only within one. The results' `<point>_chain_cpu_over_floor_less_own_code` is the measured chain ÷ floor less the own code's share: what it would be if the services' own code cost nothing.",
    '',
  ];
  const summaryRows: (string | number)[][] = [];
  const pointTables: string[] = [];
  for (const point of points) {
    const rows = profiles
      .filter(({ name, pid }) => services.includes(name) || sizeOfHop.get(pid) === point.size.key)
      .map(({ name, profile }) => {
        const isService = services.includes(name);
        return { name, isService, us: perRequest(profile, isService ? point.real : point.floor) };
      });
    const chain = sum(rows.filter((r) => r.isService).map((r) => r.us));
    const floor = sum(rows.filter((r) => !r.isService).map((r) => r.us));
    const transport = TRANSPORT.reduce((n, a) => n + chain[a], 0);
    const pointFigures = {
      profile_chain_us: round(chain.busy, 1),
      profile_floor_us: round(floor.busy, 1),
      profile_own_code_us: round(chain['own code'], 1),
      profile_own_code_share: round(chain['own code'] / chain.busy),
      profile_transport_share: round(transport / chain.busy),
    };
    for (const [name, value] of Object.entries(pointFigures)) figures[`${point.key}_${name}`] = value;
    summaryRows.push([
      point.key,
      Math.round(chain.busy),
      Math.round(floor.busy),
      round(chain.busy / floor.busy),
      Math.round(chain['own code']),
      Math.round(100 * pointFigures.profile_own_code_share),
      Math.round(100 * pointFigures.profile_transport_share),
    ]);
    const cells = (us: AreaUs) => [Math.round(us.busy), ...AREAS.map((a) => Math.round(us[a]))];
    pointTables.push(
      `### ${point.size.key} tensor (${point.size.model}), c=${point.concurrency}: ${point.real.requests} requests through the services, ${point.floor.requests} through the floor`,
      '',
      markdownTable(
        ['µs a request', 'busy', ...AREAS],
        [
          ...rows.map((r) => [r.name, ...cells(r.us)]),
          ['all services', ...cells(chain)],
          [`floor (${HOPS} hops)`, ...cells(floor)],
        ],
      ),
      '',
    );
  }
  lines.push(
    "## Per point: main threads' busy µs a request",
    '',
    markdownTable(
      ['point', 'services', 'floor', 'services ÷ floor', 'own code', 'own code %', 'transport %'],
      summaryRows,
    ),
    '',
    '## Per point and process: busy µs a request by area',
    '',
    ...pointTables,
    `## Top ${PROFILE_TOP} self-time functions of each service, all points, as a share of its busy time`,
    '',
  );
  for (const { name, profile } of profiles.filter((p) => services.includes(p.name))) {
    const { busyMs, top } = topSelfTime(
      profile,
      points.map((p) => p.real),
      PROFILE_TOP,
    );
    lines.push(
      `### ${name}: busy ${Math.round(busyMs)} ms`,
      '',
      markdownTable(
        ['self % of busy', 'function', 'file'],
        top.map((entry) => [entry.percent.toFixed(1), entry.name, entry.file]),
      ),
      '',
    );
  }
  return { markdown: lines.join('\n'), figures };
}

/** Where a profile sample's time is counted. */
const AREAS = ['own code', 'grpc-js', 'node', 'native', 'gc'] as const;
type Area = (typeof AREAS)[number];
const TRANSPORT: readonly Area[] = ['grpc-js', 'node', 'native'];
const AREA_MEANING: Record<Area, string> = {
  'own code':
    "the services' JavaScript and the packages they call other than grpc-js (protobuf-es, prom-client, OpenTelemetry, pino, NestJS, onnxruntime-node's binding), with the Node built-ins those call",
  'grpc-js': 'grpc-js (and grpc-js-xds), with the Node built-ins (HTTP/2, streams, timers) it calls',
  node: "Node's JavaScript run from the event loop's native callbacks (HTTP/2 sessions, sockets, ticks) before either of the above",
  native: 'native code V8 does not attribute to a function: (program), the event loop, nghttp2, system calls',
  gc: 'the garbage collector',
};

interface Window {
  from: number;
  to: number;
}

/** The busy time of the samples taken within `window` and its split by area, in µs. */
function timeByArea(profile: CpuProfile, window: Window): { busyUs: number; us: Record<Area, number> } {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  /** The area of a node: that of the nearest frame, itself first, that is the services' or grpc-js's, else its own kind. */
  const areaOf = new Map<number, Area>();
  const classify = (id: number): Area => {
    const known = areaOf.get(id);
    if (known !== undefined) return known;
    const { functionName, url } = byId.get(id)!.callFrame;
    let area: Area;
    if (url.includes('/node_modules/@grpc/')) area = 'grpc-js';
    else if (url.startsWith('file://') || url.startsWith('/')) area = 'own code';
    else {
      const up = parent.get(id);
      const inherited = up === undefined ? undefined : classify(up);
      if (inherited === 'own code' || inherited === 'grpc-js') area = inherited;
      else if (functionName === '(garbage collector)') area = 'gc';
      else area = url.startsWith('node:') ? 'node' : 'native';
    }
    areaOf.set(id, area);
    return area;
  };
  const us = Object.fromEntries(AREAS.map((a) => [a, 0])) as Record<Area, number>;
  let busyUs = 0;
  forEachBusySample(profile, window, (node, dt) => {
    us[classify(node.id)] += dt;
    busyUs += dt;
  });
  return { busyUs, us };
}

/** Calls `visit` with each sample taken within `window` that is not idle: its node and the time it stands for, in µs. */
function forEachBusySample(
  profile: CpuProfile,
  window: Window,
  visit: (node: CpuProfile['nodes'][number], dt: number) => void,
): void {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  let at = profile.startTime;
  for (const [i, id] of profile.samples.entries()) {
    at += profile.timeDeltas[i] ?? 0;
    const node = byId.get(id)!;
    if (at < window.from || at > window.to || node.callFrame.functionName === '(idle)') continue;
    visit(node, profile.timeDeltas[i + 1] ?? 0);
  }
}

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string }; children?: number[] }[];
  /** Microseconds on the monotonic clock (process.hrtime's). */
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** Now on the clock of a CPU profile's timestamps, in microseconds. */
const monotonicUs = () => Number(process.hrtime.bigint() / 1000n);

/**
 * The functions with the most self time in the samples taken within `windows` (not between them,
 * where the next size warms up), as a share of the time not idle, and that time.
 */
function topSelfTime(
  profile: CpuProfile,
  windows: readonly Window[],
  count: number,
): { busyMs: number; top: { name: string; file: string; percent: number }[] } {
  const self = new Map<string, number>();
  let busy = 0;
  for (const window of windows) {
    forEachBusySample(profile, window, ({ callFrame: frame }, dt) => {
      const key = `${frame.functionName || '(anonymous)'}\t${frame.url
        .replace(/^.*node_modules\//, '')
        .replace(/^.*\/dist\//, '')
        .replace(/^file:\/\//, '')}`;
      self.set(key, (self.get(key) ?? 0) + dt);
      busy += dt;
    });
  }
  const top = [...self.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, count)
    .map(([key, us]) => {
      const [name, file] = key.split('\t') as [string, string];
      return { name, file: file || '(native)', percent: (100 * us) / busy };
    });
  return { busyMs: busy / 1000, top };
}
