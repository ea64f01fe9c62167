import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { type CallContext, Errors, GrpcServer, type ServiceImpl } from '@infermesh/grpc';
import { FINGERPRINT_BYTES, KeyFilter } from '@infermesh/tensors';
import {
  CacheService,
  type WatchKeysResponseSchema,
  type LookupRequest,
  type StoreRequest,
} from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import {
  DataType,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually, ManualClock } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import type { RouterConfig } from './router.config';
import {
  CacheAdapter,
  CARRIED_MAX_BYTES,
  KEY_WATCH_BACKOFF,
  KEY_WATCH_UNSUPPORTED_RETRY_MS,
  STORE_DELAY_MS,
} from './upstreams.adapter';

/** A cache service that records the calls it gets, finds nothing, and never says which keys it holds. */
class RecordingCache implements Omit<ServiceImpl<typeof CacheService>, 'lookups' | 'stores'> {
  readonly lookupCalls: LookupRequest[] = [];
  readonly storeCalls: StoreRequest[] = [];
  lookup = async (request: LookupRequest) => {
    this.lookupCalls.push(request);
    return { found: false };
  };
  store = async (request: StoreRequest) => {
    this.storeCalls.push(request);
    return { stored: true };
  };
  watchCalls = 0;
  /** What the next WatchKeys streams say: by default nothing, ever (the stream stays open). */
  digests: (ctx: CallContext) => AsyncIterable<WatchKeysResponseInit> = silence;
  async *watchKeys(_request: unknown, ctx: CallContext) {
    this.watchCalls++;
    yield* this.digests(ctx);
  }
}

type WatchKeysResponseInit = MessageInitShape<typeof WatchKeysResponseSchema>;

async function* silence(ctx: CallContext): AsyncGenerator<WatchKeysResponseInit> {
  await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
}

/** Digests the test sends on the open WatchKeys stream, or an error that ends it. */
class DigestFeed {
  private queue: (WatchKeysResponseInit | Error)[] = [];
  private wake: (() => void) | undefined;

  send(item: WatchKeysResponseInit | Error): void {
    this.queue.push(item);
    this.wake?.();
  }

  async *stream(ctx: CallContext): AsyncGenerator<WatchKeysResponseInit> {
    for (;;) {
      while (this.queue.length === 0 && !ctx.signal.aborted) {
        await new Promise<void>((resolve) => {
          this.wake = resolve;
          ctx.signal.addEventListener('abort', () => resolve(), { once: true });
        });
      }
      // A stream the router left takes nothing meant for the next.
      if (ctx.signal.aborted) return;
      const item = this.queue.shift()!;
      if (item instanceof Error) throw item;
      yield item;
    }
  }
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
    server.add(CacheService, cache, { lookups: 'lookup', stores: 'store' });
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

    expect(cache.lookupCalls.map((l) => l.stores.map((s) => Buffer.from(s.key).toString('hex')))).toEqual([
      [],
      [a.toString('hex'), b.toString('hex')],
      [],
    ]);
    expect(cache.lookupCalls[1]!.stores[0]!.ttlMs).toBe(60_000n);
    // Carried: no Store call waits for STORE_DELAY_MS any more.
    expect(clock.pendingInMs()).toEqual([]);
    clock.advance(STORE_DELAY_MS);
    await sut.lookup(randomBytes(32), 1_000); // after anything the timer would have sent
    expect(cache.storeCalls).toHaveLength(0);
  });

  it('sends an answer by itself when no lookup comes to carry it', async () => {
    const key = randomBytes(32);
    await sut.store(key, answer(16), 60_000, 1_000);
    expect(clock.pendingInMs()).toEqual([STORE_DELAY_MS]);
    clock.advance(STORE_DELAY_MS - 1);
    expect(cache.storeCalls).toHaveLength(0);
    clock.advance(1);
    await eventually(() => cache.storeCalls.length === 1);
    expect(Buffer.from(cache.storeCalls[0]!.key)).toEqual(key);
    await sut.lookup(randomBytes(32), 1_000);
    expect(cache.lookupCalls[0]!.stores).toHaveLength(0);
  });

  it('sends a large answer at once by itself, never on a lookup', async () => {
    await sut.store(randomBytes(32), answer(CARRIED_MAX_BYTES + 1), 60_000, 1_000);
    expect(cache.storeCalls).toHaveLength(1);
    await sut.lookup(randomBytes(32), 1_000);
    expect(cache.lookupCalls[0]!.stores).toHaveLength(0);
  });

  describe('told which keys the cache holds (WatchKeys)', () => {
    const fingerprint = (key: Uint8Array) => key.subarray(0, FINGERPRINT_BYTES);
    let feed: DigestFeed;
    beforeEach(async () => {
      feed = new DigestFeed();
      cache.digests = (ctx) => feed.stream(ctx);
      // The adapter's watch opened before the feed was in place: open it again on the feed.
      await eventually(() => cache.watchCalls === 1);
      feed.send(new Error('reopen on the feed'));
      await eventually(() => clock.pendingInMs().length === 1);
      clock.advance(clock.pendingInMs()[0]!);
      await eventually(() => cache.watchCalls === 2);
    });

    it('says a key the filter lacks is certainly absent, learns keys stored since, and its own stores at once', async () => {
      const [held, other, later, own] = [randomBytes(32), randomBytes(32), randomBytes(32), randomBytes(32)];
      expect(sut.certainlyAbsent(other)).toBe(false); // nothing said yet: every key is looked up
      const filter = KeyFilter.sized(1_000);
      filter.add(held);
      feed.send({ filter: { bits: filter.bits, hashes: filter.hashes } });
      await eventually(() => sut.certainlyAbsent(other));
      expect(sut.certainlyAbsent(held)).toBe(false);
      expect(sut.certainlyAbsent(later)).toBe(true);

      feed.send({ added: fingerprint(later) });
      await eventually(() => !sut.certainlyAbsent(later));
      await sut.store(own, answer(16), 60_000, 1_000);
      expect(sut.certainlyAbsent(own)).toBe(false);
      expect(sut.certainlyAbsent(randomBytes(32))).toBe(true);
    });

    it('looks every key up from when the watch fails until the cache says again, backing off to reopen it', async () => {
      const filter = KeyFilter.sized(1_000);
      feed.send({ filter: { bits: filter.bits, hashes: filter.hashes } });
      const key = randomBytes(32);
      await eventually(() => sut.certainlyAbsent(key));

      feed.send(new Error('the cache restarted'));
      await eventually(() => !sut.certainlyAbsent(key));
      await eventually(() => clock.pendingInMs().length === 1);
      expect(clock.pendingInMs()).toEqual([KEY_WATCH_BACKOFF.initialMs]);
      clock.advance(KEY_WATCH_BACKOFF.initialMs);
      await eventually(() => cache.watchCalls === 3);
      feed.send({ filter: { bits: filter.bits, hashes: filter.hashes } });
      await eventually(() => sut.certainlyAbsent(key));
    });

    it('drops a digest it cannot use and looks every key up, as when the watch fails', async () => {
      const filter = KeyFilter.sized(1_000);
      feed.send({ filter: { bits: filter.bits, hashes: filter.hashes } });
      const key = randomBytes(32);
      await eventually(() => sut.certainlyAbsent(key));
      feed.send({ added: new Uint8Array(5) }); // not whole fingerprints
      await eventually(() => !sut.certainlyAbsent(key));
      await eventually(() => clock.pendingInMs().length === 1);
      feed.send({ filter: { bits: new Uint8Array(8), hashes: 99 } });
      clock.advance(clock.pendingInMs()[0]!);
      await eventually(() => cache.watchCalls === 3);
      await eventually(() => clock.pendingInMs().length === 1);
      expect(sut.certainlyAbsent(key)).toBe(false);
    });

    it('asks again only after KEY_WATCH_UNSUPPORTED_RETRY_MS a cache that cannot say which keys it holds', async () => {
      feed.send(Errors.notImplemented('this cache keeps its results in Redis'));
      await eventually(() => clock.pendingInMs().length === 1);
      expect(clock.pendingInMs()).toEqual([KEY_WATCH_UNSUPPORTED_RETRY_MS]);
      expect(sut.certainlyAbsent(randomBytes(32))).toBe(false);
    });
  });

  it('sends what is pending when the router stops', async () => {
    await sut.store(randomBytes(32), answer(16), 60_000, 1_000);
    await sut.onApplicationShutdown();
    expect(cache.storeCalls).toHaveLength(1);
  });
});
