import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Worker } from 'node:worker_threads';
import { countBuffersInHeapLimit, GARBAGE_HEADROOM_BYTES, growingPercentFor, keepGarbageHeadroom } from './heap';

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

describe(growingPercentFor.name, () => {
  const MiB = 2 ** 20;

  it('gives the headroom as a share of what the last full collection left alive', () => {
    expect(growingPercentFor(32 * MiB, GARBAGE_HEADROOM_BYTES)).toBe(600);
    expect(growingPercentFor(48 * MiB, 192 * MiB)).toBe(400);
  });

  it("leaves V8's own factor (0) where it allows as much, and is capped for a nearly empty heap", () => {
    expect(growingPercentFor(64 * MiB, 192 * MiB)).toBe(0);
    expect(growingPercentFor(1024 * MiB, 192 * MiB)).toBe(0);
    expect(growingPercentFor(1 * MiB, 192 * MiB)).toBe(1_000);
    expect(growingPercentFor(0, 192 * MiB)).toBe(1_000);
  });
});

describe(keepGarbageHeadroom.name, () => {
  /** A full collection of this process's heap, as V8 runs one (its 'gc' entry is observed). */
  const collect = (() => {
    setFlagsFromString('--expose-gc');
    return runInNewContext('gc') as () => void;
  })();
  const live = () => process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
  /** Until the observer has seen the collection and set the percent again (entries come between tasks). */
  const settled = () => new Promise((resolve) => setTimeout(resolve, 50));

  it('sets the percent from what each full collection leaves alive', async () => {
    // What a collection leaves alive, once the buffers it freed are released (after it, off the main thread).
    const leftAlive = async () => {
      collect();
      await settled();
      return live();
    };
    // Six times this process's live size: headroom for six, while that is what it holds.
    const headroomBytes = 6 * (await leftAlive());
    const headroom = keepGarbageHeadroom(headroomBytes, []);
    /**
     * The percent follows what each collection leaves alive, which moves with what the rest of the
     * test process frees or holds from one collection to the next: within a tenth of headroom ÷ that.
     */
    const expectHeadroomFor = (alive: number) => {
      const share = (100 * headroomBytes) / alive;
      expect(headroom?.percent).toBeGreaterThan(Math.max(0.9 * share, 300));
      expect(headroom?.percent).toBeLessThan(1.1 * share);
    };
    try {
      expectHeadroomFor(live());

      // A large request alive across a full collection: the same headroom is now less than V8's own factor gives.
      let held: Buffer | undefined = Buffer.alloc(3 * live(), 1);
      await leftAlive();
      expect(headroom?.percent).toBe(0);

      held = undefined;
      expectHeadroomFor(await leftAlive());
      expect(held).toBeUndefined();
    } finally {
      headroom?.stop();
    }
  });

  it('does nothing in a process started with --heap-growing-percent', () => {
    expect(keepGarbageHeadroom(GARBAGE_HEADROOM_BYTES, ['--heap-growing-percent=0'])).toBeUndefined();
    expect(keepGarbageHeadroom(GARBAGE_HEADROOM_BYTES, ['--heap_growing_percent=250'])).toBeUndefined();
  });
});
