import { Worker } from 'node:worker_threads';
import { countBuffersInHeapLimit } from './heap';

/**
 * Full collections in a fresh thread (an isolate of its own, its heap nearly empty, so that the
 * count does not depend on what the test process holds) while it allocates and drops 1 GiB of
 * 256 KiB buffers, one kept at a time.
 */
const CHURN = `
const { parentPort } = require('node:worker_threads');
const { constants, PerformanceObserver } = require('node:perf_hooks');
const { setImmediate: tick } = require('node:timers/promises');
let major = 0;
const observer = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) if (entry.detail.kind === constants.NODE_PERFORMANCE_GC_MAJOR) major += 1;
});
observer.observe({ entryTypes: ['gc'] });
(async () => {
  let kept;
  for (let i = 0; i < 4096; i++) {
    kept = new Uint8Array(256 * 1024);
    kept[0] = i;
    if (i % 64 === 0) await tick(); // GC entries are delivered between tasks
  }
  await tick();
  await tick();
  observer.disconnect();
  parentPort.postMessage(major);
})();
`;

function majorCollectionsDuringBufferChurn(): Promise<number> {
  return new Promise((resolve, reject) => {
    const thread = new Worker(CHURN, { eval: true });
    thread.once('message', (major: number) => void thread.terminate().then(() => resolve(major)));
    thread.once('error', reject);
  });
}

describe(countBuffersInHeapLimit.name, () => {
  it('stops buffer churn alone from causing full collections', async () => {
    // Without it V8 collects the whole heap for each 64 MiB of buffers allocated since the last time.
    expect(await majorCollectionsDuringBufferChurn()).toBeGreaterThanOrEqual(8);

    // A process started with the flag's negation keeps V8's default.
    expect(countBuffersInHeapLimit(['--no-external-memory-accounted-in-global-limit'])).toBe(false);
    expect(await majorCollectionsDuringBufferChurn()).toBeGreaterThanOrEqual(8);

    expect(countBuffersInHeapLimit([])).toBe(true);

    expect(await majorCollectionsDuringBufferChurn()).toBeLessThanOrEqual(1);
  });
});
