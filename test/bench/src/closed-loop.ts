import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import type { System } from '@infermesh/system';
import { readdirSync, readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { API_KEY, type Fixture } from '../../e2e/support/system-fixture';
import { seedElements } from './raw-infer';
import { quantile, round } from './stats';

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
const TICKS_PER_S = 100;

/** The name and the CPU time (user + system, in microseconds) a /proc stat file gives. */
function parseStat(stat: string): { name: string; us: number } {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const us = ((Number(fields[11]) + Number(fields[12])) / TICKS_PER_S) * 1e6; // utime, stime (fields 14 and 15)
  return { name: stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')), us };
}

/** CPU time (user + system) of a process so far, in microseconds. */
export function cpuUs(pid: number): number {
  return parseStat(readFileSync(`/proc/${pid}/stat`, 'utf8')).us;
}

/** CPU time so far of a process's threads named `name`, in microseconds. */
export function threadsCpuUs(pid: number, name: string): number {
  let us = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${task}/stat`, 'utf8');
    } catch {
      continue; // a thread that ended meanwhile
    }
    const thread = parseStat(stat);
    if (thread.name === name) us += thread.us;
  }
  return us;
}

/** Resident memory of a process (VmRSS), in bytes. */
export function rssBytes(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (match === null) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(match[1]) * 1024;
}

/** Every service process of a system with its service's name. */
export function serviceProcesses(system: System): { name: string; pid: number }[] {
  return system.allProcesses.map((p) => ({ name: p.name, pid: p.pid! }));
}

/** What one or more phases of load measured. */
export interface Phase {
  latenciesMs: number[];
  failures: number;
  /** CPU time all the measured processes used meanwhile. */
  cpuUs: number;
  /** The same by process name (a service's replicas together), when the phase names them. */
  cpuUsByName: Record<string, number>;
}

export function emptyPhase(): Phase {
  return { latenciesMs: [], failures: 0, cpuUs: 0, cpuUsByName: {} };
}

/** Adds a phase's measurements to a running total. */
export function addPhase(total: Phase, phase: Phase): void {
  // One at a time: a phase of short calls holds more latencies than a call's arguments may.
  for (const ms of phase.latenciesMs) total.latenciesMs.push(ms);
  total.failures += phase.failures;
  total.cpuUs += phase.cpuUs;
  for (const [name, us] of Object.entries(phase.cpuUsByName))
    total.cpuUsByName[name] = (total.cpuUsByName[name] ?? 0) + us;
}

export interface LoadOptions {
  concurrency: number;
  durationMs: number;
  /** Together the clients send at most this many calls a second; default: each as soon as its previous answer came. */
  ratePerS?: number;
}

/**
 * Closed-loop load: `concurrency` clients each make `call(seed)` as soon as their previous call
 * answered (or paced, with `ratePerS`, so that together they make at most that many a second: the
 * same load whatever each answer costs, as long as the server keeps up), for `durationMs`. Every call
 * gets a seed of its own, from `seedBase` up. Returns the latencies of the calls that succeeded, the
 * failures, and the CPU the named processes used meanwhile (from /proc, so Linux only).
 */
export async function closedLoop(
  processes: readonly { name: string; pid: number }[],
  seedBase: number,
  options: LoadOptions,
  call: (seed: number) => Promise<unknown>,
): Promise<Phase> {
  const cpuBefore = processes.map((p) => cpuUs(p.pid));
  const latenciesMs: number[] = [];
  let failures = 0;
  let seed = seedBase;
  const end = Date.now() + options.durationMs;
  // Each client's turn comes every `interval` ms, the clients' turns spread evenly.
  const interval = options.ratePerS === undefined ? 0 : (1000 * options.concurrency) / options.ratePerS;
  const began = performance.now();
  await Promise.all(
    Array.from({ length: options.concurrency }, async (_, client) => {
      for (let turn = 0; Date.now() < end; turn++) {
        const due = began + (turn + client / options.concurrency) * interval;
        const wait = due - performance.now();
        if (wait > 1) await new Promise((resolve) => setTimeout(resolve, wait));
        if (Date.now() >= end) break;
        seed += 1;
        const start = performance.now();
        try {
          await call(seed);
          latenciesMs.push(performance.now() - start);
        } catch {
          failures += 1;
        }
      }
    }),
  );
  const cpuUsByName: Record<string, number> = {};
  let total = 0;
  for (const [i, p] of processes.entries()) {
    const used = cpuUs(p.pid) - cpuBefore[i]!;
    cpuUsByName[p.name] = (cpuUsByName[p.name] ?? 0) + used;
    total += used;
  }
  return { latenciesMs, failures, cpuUs: total, cpuUsByName };
}

/** What warmUp took to bring a path to its steady state. */
export interface WarmUp {
  /** How long it ran, in ms. */
  ms: number;
  requests: number;
  /** The throughput of its first window and of its last, requests a second. */
  firstRps: number;
  lastRps: number;
}

/** warmUp's windows, and how long it runs at least and at most. */
const WARM_UP = { windowMs: 3_000, minMs: 30_000, maxMs: 90_000, windows: 3, tolerance: 0.05 };

/**
 * Closed-loop load (see closedLoop) until the path answers as fast as it will: until the throughputs
 * of the last WARM_UP.windows windows are within WARM_UP.tolerance of their mean, after at least
 * WARM_UP.minMs, at most WARM_UP.maxMs. A system just started costs several times its steady CPU
 * per request for its first tens of thousands of requests (V8 compiling and recompiling the
 * services' code as it learns their shapes, the heap growing to its working size), where a bare
 * hop's few functions are compiled at once: measured cold, the services would be weighed against a
 * warm floor. On this machine the services' throughput at c=16 still rose for about 25 s (15,000
 * requests of the small tensor), from a third of where it settled: hence at least 30 s. Failed calls
 * are not counted.
 */
export async function warmUp(
  concurrency: number,
  call: (seed: number) => Promise<unknown>,
  seedBase = 9e8,
): Promise<WarmUp> {
  const rps: number[] = [];
  let requests = 0;
  const start = performance.now();
  for (;;) {
    const window = await closedLoop([], seedBase + requests, { concurrency, durationMs: WARM_UP.windowMs }, call);
    requests += window.latenciesMs.length;
    rps.push((window.latenciesMs.length * 1000) / WARM_UP.windowMs);
    const ms = performance.now() - start;
    const last = rps.slice(-WARM_UP.windows);
    const mean = last.reduce((a, b) => a + b, 0) / last.length;
    const settled =
      last.length === WARM_UP.windows && last.every((r) => Math.abs(r - mean) <= WARM_UP.tolerance * mean);
    if ((settled && ms >= WARM_UP.minMs) || ms >= WARM_UP.maxMs) {
      return { ms: Math.round(ms), requests, firstRps: round(rps[0]!, 1), lastRps: round(rps.at(-1)!, 1) };
    }
  }
}

/**
 * Runs `load` with calls of the tiny model through the fixture's gateway gRPC, a new input each call
 * (the seed in two elements, seedElements) so that no cache answers.
 */
async function withTinyCalls<T>(fixture: Fixture, load: (call: (seed: number) => Promise<unknown>) => Promise<T>) {
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  try {
    return await load((seed) =>
      grpc.modelInfer(
        create(ModelInferRequestSchema, {
          modelName: 'tiny',
          inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
          rawInputContents: [new Uint8Array(new Float32Array([...seedElements(seed), 2, 3]).buffer)],
        }),
        { metadata: { authorization: `Bearer ${API_KEY}` }, timeoutMs: 10_000 },
      ),
    );
  } finally {
    grpc.close();
  }
}

/**
 * Closed-loop load through the gateway's gRPC (see closedLoop): the tiny model, with a new input each
 * call so that no cache answers. The CPU is that of every service, by service name.
 */
export function phase(fixture: Fixture, seedBase: number, options: LoadOptions): Promise<Phase> {
  return withTinyCalls(fixture, (call) => closedLoop(serviceProcesses(fixture.system), seedBase, options, call));
}

/** Brings a fixture to its steady state (warmUp) with calls of the tiny model through its gateway's gRPC. */
export function warmUpTiny(fixture: Fixture, concurrency: number): Promise<WarmUp> {
  return withTinyCalls(fixture, (call) => warmUp(concurrency, call));
}

/** A total's figures over `seconds` of measured load. */
export function summarize(total: Phase, seconds: number) {
  const requests = total.latenciesMs.length;
  return {
    requests,
    failures: total.failures,
    rps: round(requests / seconds, 1),
    p50: quantile(total.latenciesMs, 0.5),
    p99: quantile(total.latenciesMs, 0.99),
    cpuUsPerRequest: total.cpuUs / Math.max(1, requests),
  };
}
