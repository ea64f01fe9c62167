import { create } from '@bufbuild/protobuf';
import { GrpcServer, type ServiceImpl } from '@infermesh/grpc';
import { CacheService, type LookupRequest, type StoreRequest } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import {
  DataType,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually, ManualClock } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import type { RouterConfig } from './router.config';
import { CacheAdapter, CARRIED_MAX_BYTES, STORE_DELAY_MS } from './upstreams.adapter';

/** A cache service that records the calls it gets and finds nothing. */
class RecordingCache implements Omit<ServiceImpl<typeof CacheService>, 'lookups'> {
  readonly lookups: LookupRequest[] = [];
  readonly stores: StoreRequest[] = [];
  lookup = async (request: LookupRequest) => {
    this.lookups.push(request);
    return { found: false };
  };
  store = async (request: StoreRequest) => {
    this.stores.push(request);
    return { stored: true };
  };
}

const answer = (bytes: number): InferenceResponse =>
  create(InferenceResponseSchema, {
    modelName: 'mlp',
    modelVersion: '1',
    outputs: [{ name: 'y', datatype: DataType.UINT8, shape: [BigInt(bytes)], data: new Uint8Array(bytes) }],
  });

describe(CacheAdapter.name, () => {
  let server: GrpcServer;
  let cache: RecordingCache;
  let sut: CacheAdapter;
  let clock: ManualClock;

  beforeEach(async () => {
    cache = new RecordingCache();
    server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: new Metrics('test'),
      maxMessageBytes: 4 * 1024 * 1024,
    });
    server.add(CacheService, cache, { lookups: 'lookup' });
    const port = await server.listen('127.0.0.1', 0);
    clock = new ManualClock(Date.now());
    sut = new CacheAdapter(
      { upstreams: { cache: `127.0.0.1:${port}` }, cache: { enabled: true } } as RouterConfig,
      new JsonLogger('test', 'error', () => undefined),
      clock,
    );
  });

  afterEach(async () => {
    await sut.onApplicationShutdown();
    await server.shutdown(100);
  });

  it('carries the answers stored since the last lookup on the next lookup: one round trip a miss', async () => {
    const [a, b, c] = [randomBytes(32), randomBytes(32), randomBytes(32)];
    await sut.lookup(a, 1_000);
    await sut.store(a, answer(16), 60_000, 1_000);
    await sut.store(b, answer(16), 60_000, 1_000);
    await sut.lookup(c, 1_000);
    await sut.lookup(randomBytes(32), 1_000);

    expect(cache.lookups.map((l) => l.stores.map((s) => Buffer.from(s.key).toString('hex')))).toEqual([
      [],
      [a.toString('hex'), b.toString('hex')],
      [],
    ]);
    expect(cache.lookups[1]!.stores[0]!.ttlMs).toBe(60_000n);
    // Carried: no Store call waits for STORE_DELAY_MS any more.
    expect(clock.pendingInMs()).toEqual([]);
    clock.advance(STORE_DELAY_MS);
    await sut.lookup(randomBytes(32), 1_000); // after anything the timer would have sent
    expect(cache.stores).toHaveLength(0);
  });

  it('sends an answer by itself when no lookup comes to carry it', async () => {
    const key = randomBytes(32);
    await sut.store(key, answer(16), 60_000, 1_000);
    expect(clock.pendingInMs()).toEqual([STORE_DELAY_MS]);
    clock.advance(STORE_DELAY_MS - 1);
    expect(cache.stores).toHaveLength(0);
    clock.advance(1);
    await eventually(() => cache.stores.length === 1);
    expect(Buffer.from(cache.stores[0]!.key)).toEqual(key);
    await sut.lookup(randomBytes(32), 1_000);
    expect(cache.lookups[0]!.stores).toHaveLength(0);
  });

  it('sends a large answer at once by itself, never on a lookup', async () => {
    await sut.store(randomBytes(32), answer(CARRIED_MAX_BYTES + 1), 60_000, 1_000);
    expect(cache.stores).toHaveLength(1);
    await sut.lookup(randomBytes(32), 1_000);
    expect(cache.lookups[0]!.stores).toHaveLength(0);
  });

  it('sends what is pending when the router stops', async () => {
    await sut.store(randomBytes(32), answer(16), 60_000, 1_000);
    await sut.onApplicationShutdown();
    expect(cache.stores).toHaveLength(1);
  });
});
