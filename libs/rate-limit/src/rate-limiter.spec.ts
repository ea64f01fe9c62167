import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import { JsonLogger } from '@infermesh/telemetry';
import { eventually, type RedisServer, startRedisServer, ManualClock } from '@infermesh/testing';
import { type Bucket, checkBucket, type RateLimiter } from './rate-limiter';
import { FallbackRateLimiter, RateLimitStoreUnavailableError } from './rate-limiter.fallback';
import { MemoryRateLimiter } from './rate-limiter.memory';
import { RedisRateLimiter } from './rate-limiter.redis';

const logger = new JsonLogger('test', 'error');

/** Takes `count` times in a row; how many were allowed. */
async function admitted(sut: RateLimiter, scope: string, buckets: Bucket[], count: number): Promise<number> {
  let allowed = 0;
  for (let i = 0; i < count; i++) if ((await sut.take(scope, buckets)).allowed) allowed += 1;
  return allowed;
}

/** The two replicas of one store, and the clock of the in-memory one (Redis has its own). */
interface Stores {
  sut: RateLimiter;
  replica: RateLimiter;
  clock: ManualClock | undefined;
}

let redis: RedisServer;
const clients: Redis[] = [];
const redisClient = async () => {
  const client = createRedisClient(redis.url, logger, 'rate-limit-test');
  await waitForRedis(client, 5_000);
  clients.push(client);
  return client;
};

beforeAll(async () => {
  redis = await startRedisServer();
});

afterAll(async () => {
  for (const client of clients) client.disconnect();
  await redis?.stop();
});

describe.each([
  [
    'MemoryRateLimiter',
    async (): Promise<Stores> => {
      const clock = new ManualClock(0);
      const shared = new MemoryRateLimiter(100_000, clock);
      return { sut: shared, replica: shared, clock };
    },
  ],
  [
    'RedisRateLimiter',
    async (): Promise<Stores> => {
      const prefix = `rl-${Math.random().toString(36).slice(2)}:`;
      // Two clients: two gateway replicas sharing one Redis, which keeps time itself (TIME).
      return {
        sut: new RedisRateLimiter(await redisClient(), prefix),
        replica: new RedisRateLimiter(await redisClient(), prefix),
        clock: undefined,
      };
    },
  ],
])('%s (the contract both stores keep)', (_name, make) => {
  let sut: RateLimiter;
  let replica: RateLimiter;
  let clock: ManualClock | undefined;

  beforeEach(async () => {
    ({ sut, replica, clock } = await make());
  });

  it('admits a burst, then refuses with the time until the next token', async () => {
    const bucket = { key: 'all', ratePerS: 2, burst: 5 };

    expect(await admitted(sut, 'tenant-a', [bucket], 5)).toBe(5);
    const refused = await sut.take('tenant-a', [bucket]);

    expect(refused.allowed).toBe(false);
    expect(refused.limitedBy).toBe('all');
    expect(refused.retryAfterMs).toBeGreaterThan(0);
    expect(refused.retryAfterMs).toBeLessThanOrEqual(500);
  });

  it('refills at the configured rate: the next token comes when the refusal said', async () => {
    // 4/s refills a token every 250 ms: two calls in a row take far less, even on a busy machine
    // (at 50/s, 20 ms between two Redis round trips was seen to refill one).
    const bucket = { key: 'all', ratePerS: 4, burst: 1 };
    expect(await admitted(sut, 'tenant-a', [bucket], 1)).toBe(1);
    const refused = await sut.take('tenant-a', [bucket]);
    expect(refused.allowed).toBe(false);
    expect(refused.retryAfterMs).toBeGreaterThan(0);
    expect(refused.retryAfterMs).toBeLessThanOrEqual(250);

    if (clock !== undefined) {
      clock.advance(refused.retryAfterMs - 1);
      expect((await sut.take('tenant-a', [bucket])).allowed).toBe(false);
      clock.advance(1);
      expect((await sut.take('tenant-a', [bucket])).allowed).toBe(true);
    } else {
      // Redis refills on its own clock: wait for the token. A refusal takes nothing, so asking until
      // it comes is harmless.
      await eventually(async () => (await sut.take('tenant-a', [bucket])).allowed);
    }
  });

  it('takes nothing from any bucket when one of them refuses', async () => {
    const perKey = { key: 'all', ratePerS: 0.001, burst: 10 };
    const perModel = { key: 'model:mlp', ratePerS: 0.001, burst: 2 };

    expect(await admitted(sut, 'tenant-a', [perKey, perModel], 5)).toBe(2);

    // The per-key bucket lost only the two admitted requests' tokens.
    expect(await admitted(sut, 'tenant-a', [perKey, { key: 'model:other', ratePerS: 0.001, burst: 100 }], 20)).toBe(8);
  });

  it('names the bucket that refills last when several refuse', async () => {
    const slow = { key: 'model:slow', ratePerS: 0.1, burst: 1 };
    const fast = { key: 'all', ratePerS: 10, burst: 1 };
    await sut.take('tenant-a', [slow, fast]);

    const refused = await sut.take('tenant-a', [slow, fast]);

    expect(refused).toMatchObject({ allowed: false, limitedBy: 'model:slow' });
    expect(refused.retryAfterMs).toBeGreaterThan(5_000);
  });

  it('keeps scopes apart', async () => {
    const bucket = { key: 'all', ratePerS: 0.001, burst: 3 };
    expect(await admitted(sut, 'tenant-a', [bucket], 5)).toBe(3);
    expect(await admitted(sut, 'tenant-b', [bucket], 5)).toBe(3);
  });

  it('shares one limit between replicas: concurrent takes from both admit exactly the burst', async () => {
    const bucket = { key: 'all', ratePerS: 0.001, burst: 40 };
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) => (i % 2 === 0 ? sut : replica).take('shared', [bucket])),
    );
    expect(results.filter((r) => r.allowed)).toHaveLength(40);
  });
});

describe(MemoryRateLimiter.name, () => {
  it('keeps at most maxBuckets, dropping full buckets before the least recently used', async () => {
    const clock = new ManualClock(0);
    const sut = new MemoryRateLimiter(3, clock);
    const bucket = (key: string) => ({ key, ratePerS: 1, burst: 2 });
    await sut.take('s', [bucket('a')]);
    await sut.take('s', [bucket('b')]);
    clock.advance(5_000); // a and b are full again
    await sut.take('s', [bucket('c')]);
    await sut.take('s', [bucket('d')]);
    await sut.take('s', [bucket('e')]);

    expect(sut.size).toBeLessThanOrEqual(3);
    // c, d and e each lost a token and are remembered: e has one left, then refuses.
    expect((await sut.take('s', [bucket('e')])).allowed).toBe(true);
    expect((await sut.take('s', [bucket('e')])).allowed).toBe(false);
  });
});

describe(FallbackRateLimiter.name, () => {
  const down: RateLimiter = {
    take: () => Promise.reject(new Error('connect ECONNREFUSED')),
    close: async () => undefined,
  };

  it('limits with the local buckets while the shared store is down, and counts each fallback', async () => {
    const counted: unknown[] = [];
    const sut = new FallbackRateLimiter(down, new MemoryRateLimiter(), 'local', {
      inc: (labels: unknown) => counted.push(labels),
    });

    expect(await admitted(sut, 'tenant-a', [{ key: 'all', ratePerS: 0.001, burst: 3 }], 5)).toBe(3);
    expect(counted).toHaveLength(5);
    expect(counted[0]).toEqual({ policy: 'local' });
  });

  it('admits everything with the open policy, and refuses with the closed one', async () => {
    const open = new FallbackRateLimiter(down, new MemoryRateLimiter(), 'open', { inc: () => undefined });
    const closed = new FallbackRateLimiter(down, new MemoryRateLimiter(), 'closed', { inc: () => undefined });
    const bucket = { key: 'all', ratePerS: 0.001, burst: 1 };

    expect(await admitted(open, 'tenant-a', [bucket], 5)).toBe(5);
    await expect(closed.take('tenant-a', [bucket])).rejects.toBeInstanceOf(RateLimitStoreUnavailableError);
  });

  it('falls back to the local buckets when the real Redis goes away', async () => {
    const own = await startRedisServer();
    const client = createRedisClient(own.url, logger, 'rate-limit-fallback-test');
    await waitForRedis(client, 5_000);
    let fallbacks = 0;
    const sut = new FallbackRateLimiter(new RedisRateLimiter(client, 'rl:'), new MemoryRateLimiter(), 'local', {
      inc: () => (fallbacks += 1),
    });
    const bucket = { key: 'all', ratePerS: 0.001, burst: 100 };
    try {
      expect((await sut.take('t', [bucket])).allowed).toBe(true);
      expect(fallbacks).toBe(0);
      await own.stop();
      expect((await sut.take('t', [bucket])).allowed).toBe(true);
      expect(fallbacks).toBe(1);
    } finally {
      client.disconnect();
    }
  });
});

describe(checkBucket.name, () => {
  it('refuses a rate or burst that cannot work, naming the bucket', () => {
    expect(() => checkBucket({ key: 'k', ratePerS: 0, burst: 1 })).toThrow(/rate of bucket k/);
    expect(() => checkBucket({ key: 'k', ratePerS: 1, burst: 0.5 })).toThrow(/burst of bucket k/);
    expect(() => checkBucket({ key: 'k', ratePerS: Number.NaN, burst: 1 })).toThrow(/rate/);
    expect(() => checkBucket({ key: 'k', ratePerS: 5, burst: 10 })).not.toThrow();
  });
});
