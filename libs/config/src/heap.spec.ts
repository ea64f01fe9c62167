import { constants, PerformanceObserver } from 'node:perf_hooks';
import { setImmediate as tick } from 'node:timers/promises';
import { countBuffersInHeapLimit } from './heap';

/** Full collections while 1 GiB of 256 KiB buffers are allocated and dropped, one kept at a time. */
async function majorCollectionsDuringBufferChurn(): Promise<number> {
  let major = 0;
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) if ((entry as unknown as { detail: { kind: number } }).detail.kind === constants.NODE_PERFORMANCE_GC_MAJOR) major += 1;
  });
  observer.observe({ entryTypes: ['gc'] });
  let kept = new Uint8Array(0);
  for (let i = 0; i < 4096; i++) {
    kept = new Uint8Array(256 * 1024);
    kept[0] = i;
    if (i % 64 === 0) await tick(); // GC entries are delivered between tasks
  }
  await tick();
  await tick();
  observer.disconnect();
  return major;
}

describe(countBuffersInHeapLimit.name, () => {
  it('stops buffer churn alone from causing full collections', async () => {
    // Without it V8 collects the whole heap for each 64 MiB of buffers allocated since the last time
    // (16 times here on an idle machine; fewer when collections overlap on a busy one).
    expect(await majorCollectionsDuringBufferChurn()).toBeGreaterThanOrEqual(4);

    // A process started with the flag's negation keeps V8's default.
    expect(countBuffersInHeapLimit(['--no-external-memory-accounted-in-global-limit'])).toBe(false);
    expect(await majorCollectionsDuringBufferChurn()).toBeGreaterThanOrEqual(4);

    expect(countBuffersInHeapLimit([])).toBe(true);

    expect(await majorCollectionsDuringBufferChurn()).toBeLessThanOrEqual(1);
  });
});
