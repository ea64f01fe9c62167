import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type WatchKeysResponse,
  LookupRequestSchema,
  type StoreRequest,
  StoreRequestSchema,
} from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually, rpcRejection } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import { KeyFilter } from '@infermesh/tensors';
import { systemClock } from '@infermesh/clock';
import { CacheGrpcController } from './cache.grpc';
import { loadCacheConfig } from './cache.config';
import { ResultCache } from './result-cache';
import { EmbeddedResultStore } from './result-store.embedded';
import type { ResultStore } from './result-store';

const answer = (version: string) => ({
  modelName: 'mlp',
  modelVersion: version,
  outputs: [{ name: 'y', datatype: DataType.FP32, shape: [1n], data: new Uint8Array(4) }],
});
const store = (key: Uint8Array, version: string): StoreRequest =>
  create(StoreRequestSchema, { key, response: answer(version), ttlMs: 60_000n });

describe(CacheGrpcController.name, () => {
  const config = loadCacheConfig({});
  const make = (results: ResultStore = new EmbeddedResultStore(64 * 2 ** 20)) => {
    const metrics = new Metrics('test');
    return {
      sut: new CacheGrpcController(
        new ResultCache(results, config, new JsonLogger('test', 'error', () => undefined), metrics, systemClock),
      ),
      metrics,
    };
  };

  it('keeps the answers a lookup carries, as Store does, and looks its own key up', async () => {
    const { sut } = make();
    const [a, b] = [randomBytes(32), randomBytes(32)];
    expect(await sut.lookup(create(LookupRequestSchema, { key: a, stores: [store(b, '7')] }))).toEqual({
      found: false,
    });
    await new Promise((r) => setImmediate(r));
    const found = await sut.lookup(create(LookupRequestSchema, { key: b }));
    expect(found).toMatchObject({ found: true, response: { modelVersion: '7' } });
    await sut.store(store(a, '8'));
    expect(await sut.lookup(create(LookupRequestSchema, { key: a }))).toMatchObject({
      found: true,
      response: { modelVersion: '8' },
    });
  });

  it('answers the lookup without waiting for its stores, and a store that fails fails nothing but itself', async () => {
    /** The writes under way: each fails when the test says (had the lookup waited for them, it would never answer). */
    const writes: ((error: Error) => void)[] = [];
    class StalledWrites extends EmbeddedResultStore {
      override set(): Promise<void> {
        return new Promise((_, reject) => writes.push(reject));
      }
    }
    const { sut, metrics } = make(new StalledWrites(1024));
    const answered = await sut.lookup(
      create(LookupRequestSchema, {
        key: randomBytes(32),
        stores: [store(randomBytes(32), '1'), store(randomBytes(32), '2')],
      }),
    );
    expect(answered).toEqual({ found: false });
    expect(writes).toHaveLength(2);

    for (const fail of writes) fail(new Error('redis is gone'));
    const errors = 'infermesh_test_stores_total{outcome="error"} 2';
    await eventually(async () => (await metrics.render()).includes(errors));
  });

  it('refuses a lookup carrying a malformed store before it stores or looks up anything', async () => {
    const { sut } = make();
    const good = randomBytes(32);
    const malformed = [create(StoreRequestSchema, { key: randomBytes(32) }), store(randomBytes(8), '1')];
    for (const bad of malformed) {
      const error = await rpcRejection(
        sut.lookup(create(LookupRequestSchema, { key: randomBytes(32), stores: [store(good, '1'), bad] })),
      );
      expect(error.code).toBe(status.INVALID_ARGUMENT);
    }
    expect(await sut.lookup(create(LookupRequestSchema, { key: good }))).toEqual({ found: false });
  });

  const context = (signal: AbortSignal) => ({ requestId: 'test', deadlineMs: undefined, signal, metadata: {} });

  it('tells a watcher of its keys the keys it stored, whether by Store or carried on a lookup', async () => {
    const { sut } = make();
    const [a, b, never] = [randomBytes(32), randomBytes(32), randomBytes(32)];
    await sut.store(store(a, '1'));
    await sut.lookup(create(LookupRequestSchema, { key: randomBytes(32), stores: [store(b, '2')] }));
    await new Promise((r) => setImmediate(r));
    const abort = new AbortController();
    const watch = sut.watchKeys({}, context(abort.signal));
    const first = (await watch.next()).value as WatchKeysResponse;
    const filter = new KeyFilter(first.filter!.bits, first.filter!.hashes);
    expect([filter.has(a), filter.has(b), filter.has(never)]).toEqual([true, true, false]);
    abort.abort();
    expect((await watch.next()).done).toBe(true);
  });

  it('cannot say which keys a store shared in Redis holds: WatchKeys fails UNIMPLEMENTED, naming why', async () => {
    class Shared extends EmbeddedResultStore {
      override heldKeys() {
        return undefined;
      }
    }
    const { sut } = make(new Shared(1024));
    const error = await rpcRejection(sut.watchKeys({}, context(new AbortController().signal)).next());
    expect(error.code).toBe(status.UNIMPLEMENTED);
    expect(error.message).toContain('Redis');
  });
});
