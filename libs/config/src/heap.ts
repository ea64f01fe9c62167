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
 * default. Returns whether it set the flag. Called by the services that carry tensors (gateway, router,
 * batcher, worker), not by the cache service, whose memory its byte budget bounds (garbage held until
 * the global limit took it 12 MiB past budget + 64 MiB in the hostile-state e2e spec), nor by the
 * registry, which carries no requests.
 */
export function countBuffersInHeapLimit(execArgv: readonly string[] = process.execArgv): boolean {
  if (execArgv.some((arg) => /^--no[-_]external[-_]memory[-_]accounted[-_]in[-_]global[-_]limit$/.test(arg)))
    return false;
  setFlagsFromString('--external-memory-accounted-in-global-limit');
  return true;
}
