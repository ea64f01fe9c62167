import { constants, type PerformanceEntry, PerformanceObserver } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';

/**
 * Has V8 count ArrayBuffer memory within its heap's global limit, instead of running a full
 * mark-compact of the whole heap each time such off-heap memory has grown by 64 MiB since the last,
 * whatever the heap holds. Every request that carries tensors leaves a service a few buffers the size
 * of its tensors (the message as received, the one sent on, the answer both ways): with 110 KiB
 * inputs, a full collection about every 120 requests in each service (64 MiB over five such buffers),
 * and the largest part of the gateway's CPU per request. Measured on this machine:
 * the path's CPU per request with the 110 KiB CNN input falls by half and its p50 at c=1 by 40 %
 * (`npm run bench -- path`), the worker's items/s at batch 32 rise by 20 to 40 % (`npm run bench --
 * quantization`); a service holds more garbage before it collects (the worker about 80 MiB more under
 * that load). V8 reads the flag whenever it sets its limits, so setting it as a program starts takes
 * effect for the whole process, its worker threads included. A process started with
 * `--no-external-memory-accounted-in-global-limit` (where memory is tighter than CPU) keeps V8's
 * default. Returns whether it set the flag. Called through tuneHeapForTensors by the services that
 * carry tensors (gateway, router, batcher, worker), not by the cache service, whose memory its byte
 * budget bounds (garbage held until the global limit took it 12 MiB past budget + 64 MiB in the
 * hostile-state e2e spec), nor by the registry, which carries no requests.
 */
export function countBuffersInHeapLimit(execArgv: readonly string[] = process.execArgv): boolean {
  if (execArgv.some((arg) => /^--no[-_]external[-_]memory[-_]accounted[-_]in[-_]global[-_]limit$/.test(arg)))
    return false;
  setFlagsFromString('--external-memory-accounted-in-global-limit');
  return true;
}

/** The garbage a service that carries tensors may hold before a full collection (keepGarbageHeadroom). */
export const GARBAGE_HEADROOM_BYTES = 192 * 2 ** 20;
/**
 * V8's own growing factor reaches 4 at most (3 × the live size of headroom): below that, its own
 * choice stands, which also shrinks the heap when the process idles or memory is short.
 */
const V8_MAX_GROWTH_PERCENT = 300;
/** The factor is never set above 11 × the live size, however little that is. */
const MAX_GROWTH_PERCENT = 1_000;

/**
 * The heap growing percent (V8's `--heap-growing-percent`: the next full collection starts once the
 * heap and its buffers together reach (1 + percent / 100) × what the last left alive) that lets a
 * process whose last full collection left `liveBytes` alive hold `headroomBytes` of garbage before
 * the next; 0 (V8's own factor) where its own would allow that much or more.
 */
export function growingPercentFor(liveBytes: number, headroomBytes: number): number {
  const percent = Math.round((100 * headroomBytes) / Math.max(liveBytes, 1));
  return percent <= V8_MAX_GROWTH_PERCENT ? 0 : Math.min(percent, MAX_GROWTH_PERCENT);
}

export interface GarbageHeadroom {
  /** The percent set now (0: V8's own factor). */
  readonly percent: number;
  /** Stops following the live size and hands the factor back to V8. */
  stop(): void;
}

/**
 * Lets a process hold up to `headroomBytes` of garbage before V8 runs a full mark-compact, whatever
 * its live size, instead of V8's own growing factor (at most 4 × the live size, often less: about
 * 60 to 100 MiB above a service's 25 to 30 MiB). A full collection costs a service 10 to 20 ms of
 * marking its live heap, whatever the garbage; the buffers each request leaves (see
 * countBuffersInHeapLimit) fill V8's margin in about 150 requests of 110 KiB, so with 192 MiB a
 * service collects a fraction as often (0 to 8 full collections in 5 s where there were 13 or 14).
 * Measured on this machine with the 110 KiB CNN input at c=1 (the path benchmark's services, CPU per
 * request from /proc, eight windows of 2.5 s each): the chain's CPU fell from 2,105 to 1,337 µs a
 * request (median); the gateway's, router's and batcher's resident memory under that load rose by 67
 * to 94 MiB, the worker's not at all. V8's factor is a multiple of the live size: after each full collection the
 * percent is set again from what it left alive (heap used + array buffers), so that a process
 * whose live set grows (a large request in flight) keeps the same headroom, not eight times more, and
 * from 64 MiB alive (headroom ÷ 3) V8's own factor applies again. A process started with
 * `--heap-growing-percent=N` keeps N (0: V8's own factor) and this does nothing.
 */
export function keepGarbageHeadroom(
  headroomBytes = GARBAGE_HEADROOM_BYTES,
  execArgv: readonly string[] = process.execArgv,
): GarbageHeadroom | undefined {
  if (execArgv.some((arg) => /^--heap[-_]growing[-_]percent(=|$)/.test(arg))) return undefined;
  let percent = -1;
  const follow = () => {
    // Array buffers as swept (Node's count), not V8's external total, which keeps the dead ones until the next collection.
    const { heapUsed, arrayBuffers } = process.memoryUsage();
    const next = growingPercentFor(heapUsed + arrayBuffers, headroomBytes);
    if (next === percent) return;
    percent = next;
    setFlagsFromString(`--heap-growing-percent=${percent}`);
  };
  follow();
  // V8 sets its next limit as each full collection ends, from the factor then: the percent follows
  // the live size one collection behind, which moves little from one to the next.
  const observer = new PerformanceObserver((list) => {
    if (list.getEntries().some(isFullCollection)) follow();
  });
  observer.observe({ entryTypes: ['gc'] });
  return {
    get percent() {
      return percent;
    },
    stop() {
      observer.disconnect();
      setFlagsFromString('--heap-growing-percent=0');
    },
  };
}

/** A 'gc' performance entry of a full (mark-compact) collection. */
function isFullCollection(entry: PerformanceEntry): boolean {
  return (entry as { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR;
}

/**
 * The V8 settings of a process that carries tensors (the gateway, router, batcher and worker, and
 * the benchmarks' bare hops that stand for them): ArrayBuffers counted in the heap's limit
 * (countBuffersInHeapLimit) and a fixed headroom of garbage before a full collection
 * (keepGarbageHeadroom). Each can be set otherwise on the process's command line.
 */
export function tuneHeapForTensors(execArgv: readonly string[] = process.execArgv): void {
  countBuffersInHeapLimit(execArgv);
  keepGarbageHeadroom(GARBAGE_HEADROOM_BYTES, execArgv);
}
