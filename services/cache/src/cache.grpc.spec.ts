import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  LookupRequestSchema,
  type StoreRequest,
  StoreRequestSchema,
} from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { randomBytes } from 'node:crypto';
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
        new ResultCache(results, config, new JsonLogger('test', 'error', () => undefined), metrics),
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
    class StalledWrites extends EmbeddedResultStore {
      override set(): Promise<void> {
        return new Promise((_, reject) => setTimeout(() => reject(new Error('redis is gone')), 50));
      }
    }
    const { sut, metrics } = make(new StalledWrites(1024));
    const answered = await Promise.race([
      sut.lookup(
        create(LookupRequestSchema, {
          key: randomBytes(32),
          stores: [store(randomBytes(32), '1'), store(randomBytes(32), '2')],
        }),
      ),
      new Promise((r) => setTimeout(() => r('waited for the stores'), 40)),
    ]);
    expect(answered).toEqual({ found: false });
    await new Promise((r) => setTimeout(r, 80));
    expect(await metrics.render()).toContain('infermesh_test_stores_total{outcome="error"} 2');
  });

  it('refuses a lookup carrying a malformed store before it stores or looks up anything', async () => {
    const { sut } = make();
    const good = randomBytes(32);
    const malformed = [create(StoreRequestSchema, { key: randomBytes(32) }), store(randomBytes(8), '1')];
    for (const bad of malformed) {
      const error = await sut
        .lookup(create(LookupRequestSchema, { key: randomBytes(32), stores: [store(good, '1'), bad] }))
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RpcError);
      expect((error as RpcError).code).toBe(status.INVALID_ARGUMENT);
    }
    expect(await sut.lookup(create(LookupRequestSchema, { key: good }))).toEqual({ found: false });
  });
});
