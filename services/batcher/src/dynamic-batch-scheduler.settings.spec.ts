import type { MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { type BatchingSchema, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { HealthDetails } from '@infermesh/runtime';
import { eventually, rpcRejection } from '@infermesh/testing';
import { DynamicBatchScheduler } from './dynamic-batch-scheduler';
import type { BatchingPolicy } from './batching-policy';
import type { Scheduler } from './scheduler';
import { BatcherHarness, call, rowsRequest } from './testing/batcher-harness';
import { versionName as v } from './testing/fake-worker';
import { VersionSettings } from './version-settings';

/** How each version's batching settings reach the scheduler: the registry watch, else ResolveModelVersion. */
describe(DynamicBatchScheduler.name, () => {
  let h: BatcherHarness;

  beforeEach(async () => {
    h = await BatcherHarness.open();
    h.workers[0].models.set(v('mlp', '1'), ModelState.READY);
  });

  afterEach(async () => {
    await h.close();
  });

  /** Sends requests of 1 and 2 items behind a blocker on w1 (one batch per worker); returns the batch sizes w1 got. */
  async function batchesBehindBlocker(sut: Scheduler): Promise<number[]> {
    const [w1] = h.workers;
    const before = w1.received.length;
    const { blocker, release } = await h.occupy(w1);
    const answers = Promise.all([1, 2].map((rows, i) => sut.enqueue(rowsRequest(`r${i}`, rows, i), call())));
    await h.inflight(3);
    release();
    await Promise.all([blocker, answers]);
    return w1.batchSizes().slice(before);
  }

  describe('without the watch (the registry has not synced it)', () => {
    it("reads a version's settings again once BATCHER_SETTINGS_TTL_MS has passed", async () => {
      h.registry.batching.set(v('mlp', '1'), { maxBatchSize: 0 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1', BATCHER_SETTINGS_TTL_MS: '5000' });
      expect(await batchesBehindBlocker(sut)).toEqual([1, 1, 2]);
      expect(h.registry.resolveCalls).toBe(1);
      // The registry turns batching on (the signature's max batch size, 8).
      h.registry.batching.delete(v('mlp', '1'));

      h.clock.advance(4_999);
      expect(await batchesBehindBlocker(sut)).toEqual([1, 1, 2]);
      h.clock.advance(1);
      await sut.enqueue(rowsRequest('stale', 1, 0), call());
      await eventually(() => h.registry.resolveCalls === 2);
      // The answer lands in the background: wait until the settings hold it.
      let latest: BatchingPolicy | undefined;
      await eventually(() => {
        void h
          .get(VersionSettings)
          .policy(v('mlp', '1'))
          .then((p) => (latest = p));
        return latest?.maxBatchSize === 8;
      });

      expect(await batchesBehindBlocker(sut)).toEqual([1, 3]);
      expect(h.registry.resolveCalls).toBe(2);
    });

    it('keeps serving with the last batching settings while the registry is down', async () => {
      h.registry.batching.set(v('mlp', '1'), { maxBatchSize: 0 });
      const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1', BATCHER_SETTINGS_TTL_MS: '1' });
      await sut.enqueue(rowsRequest('a', 1, 0), call());
      await h.registry.stop();
      h.clock.advance(10);

      // Batching off, as the registry last said: each request goes on its own.
      expect(await batchesBehindBlocker(sut)).toEqual([1, 1, 2]);
      await expect(sut.enqueue(rowsRequest('c', 1, 0), call())).resolves.toMatchObject({ id: 'c' });
    });
  });

  describe('following the registry watch', () => {
    const mlp = (
      batching: MessageInitShape<typeof BatchingSchema>,
      states: VersionState[] = [VersionState.READY],
      unloaded = false,
    ) => ({
      name: 'models/mlp',
      unloaded,
      versions: states.map((state, i) => ({
        name: v('mlp', String(i + 1)),
        state,
        signature: { maxBatchSize: 8 },
        batching,
      })),
    });

    /** Starts the batcher and waits until its watch holds what the registry holds. */
    async function following(env: Record<string, string> = {}): Promise<Scheduler> {
      const sut = await h.start(env);
      await h.get(RegistryWatch).ready();
      return sut;
    }

    async function applied(revision: bigint): Promise<void> {
      await eventually(() => h.get(RegistryWatch).revision === revision);
    }

    it('applies new batching settings to the requests already waiting, without asking the registry', async () => {
      const [w1] = h.workers;
      h.registry.put(mlp({ maxQueueDelayUs: 10_000_000n, maxBatchSize: 4 }));
      const sut = await following({ BATCHER_MAX_BATCHES_PER_WORKER: '2' });
      const { blocker, release } = await h.occupy(w1);
      // The worker computes: the request waits up to 10 s for company, and the clock stands still.
      const waiting = sut.enqueue(rowsRequest('waiting', 1, 1), call());
      await h.inflight(2);
      expect(h.handleOf(w1).outstanding).toBe(1);

      h.registry.put(mlp({ maxQueueDelayUs: 0n, maxBatchSize: 4 }));

      await eventually(() => w1.received.length === 2);
      release();
      await Promise.all([blocker, waiting]);
      expect(h.registry.resolveCalls).toBe(0);
    });

    it('serves a DRAINING version, refuses one that is not READY, an unknown one and those of an unloaded model', async () => {
      const [w1] = h.workers;
      w1.models.set(v('mlp', '2'), ModelState.READY);
      h.registry.put(mlp({}, [VersionState.DRAINING, VersionState.LOADING]));
      const sut = await following();

      await expect(sut.enqueue(rowsRequest('late', 1, 0), call())).resolves.toMatchObject({ id: 'late' });
      const loading = await rpcRejection(sut.enqueue(rowsRequest('early', 1, 0, { modelVersion: '2' }), call()));
      expect([loading.code, loading.reason, loading.message, loading.metadata]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'version 2 of model "mlp" is LOADING, not READY',
        { model: 'mlp', version: '2', state: 'LOADING' },
      ]);
      const unknown = await rpcRejection(sut.enqueue(rowsRequest('unknown', 1, 0, { modelVersion: '9' }), call()));
      expect([unknown.code, unknown.reason, unknown.message, unknown.metadata]).toEqual([
        status.NOT_FOUND,
        'VERSION_NOT_FOUND',
        'model "mlp" has no version 9',
        { model: 'mlp', version: '9' },
      ]);

      h.registry.put(mlp({}, [VersionState.DRAINING, VersionState.READY], true));
      await applied(2n);
      const unloaded = await rpcRejection(sut.enqueue(rowsRequest('unloaded', 1, 0), call()));
      expect([unloaded.code, unloaded.reason, unloaded.message, unloaded.metadata]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'model "mlp" is unloaded',
        { model: 'mlp' },
      ]);
      expect(w1.received.map((r) => r.id)).toEqual(['late']);
      expect(h.registry.resolveCalls).toBe(0);
    });

    it('keeps serving with the settings it last saw while the registry is down, and says so in its health details', async () => {
      h.registry.put(mlp({ maxBatchSize: 0 }));
      const sut = await following({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });

      await h.registry.stop();
      await eventually(() => !h.get(RegistryWatch).status().connected);

      // Batching off, as the watch last said: each request went on its own.
      expect(await batchesBehindBlocker(sut)).toEqual([1, 1, 2]);
      expect(h.registry.resolveCalls).toBe(0);
      expect(h.get(HealthDetails).report()['registry']).toMatchObject({
        connected: false,
        serving_last_config: true,
        revision: 1,
      });
    });
  });
});
