import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import type { System } from '@infermesh/system';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { API_KEY, type Fixture } from '../../e2e/support/system-fixture';
import { quantile, round } from './stats';

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
const TICKS_PER_S = 100;

/** CPU time (user + system) of a process so far, in microseconds. */
export function cpuUs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) / TICKS_PER_S) * 1e6; // utime, stime (fields 14 and 15)
}

/** The pids of every service of a system. */
export function pids(system: System): number[] {
  return system.allProcesses.map((p) => p.pid!);
}

/** What one or more phases of load measured. */
export interface Phase {
  latenciesMs: number[];
  failures: number;
  /** CPU time all the system's services used meanwhile. */
  cpuUs: number;
}

export function emptyPhase(): Phase {
  return { latenciesMs: [], failures: 0, cpuUs: 0 };
}

/** Adds a phase's measurements to a running total. */
export function addPhase(total: Phase, phase: Phase): void {
  total.latenciesMs.push(...phase.latenciesMs);
  total.failures += phase.failures;
  total.cpuUs += phase.cpuUs;
}

/**
 * Closed-loop load through the gateway's gRPC: `concurrency` clients each send the tiny model a new
 * input (so that no cache answers) as soon as the previous answer came, for `durationMs`; with
 * `ratePerS`, paced so that together they send at most that many a second (the same load whatever
 * each answer costs, as long as the system keeps up). Returns the latencies of the successful calls,
 * the failures, and the CPU all services used meanwhile (from /proc, so Linux only); `seedBase`
 * keeps inputs distinct across phases.
 */
export async function phase(fixture: Fixture, seedBase: number, options: { concurrency: number; durationMs: number; ratePerS?: number }): Promise<Phase> {
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  const processes = pids(fixture.system);
  const cpuBefore = processes.map(cpuUs);
  const latenciesMs: number[] = [];
  let failures = 0;
  let seed = seedBase;
  const end = Date.now() + options.durationMs;
  // Each client's turn comes every `interval` ms, the clients' turns spread evenly.
  const interval = options.ratePerS === undefined ? 0 : (1000 * options.concurrency) / options.ratePerS;
  const began = performance.now();
  try {
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
