import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import { JsonLogger } from '@infermesh/telemetry';
import { eventually, type RedisServer, startRedisServer, ManualClock } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import type { ResultStore } from './result-store';
import { EmbeddedResultStore, ENTRY_OVERHEAD_BYTES } from './result-store.embedded';
import { RedisResultStore } from './result-store.redis';

const logger = new JsonLogger('test', 'error');

/**
 * One contract, run against every implementation: `make` gives a store and the ManualClock it keeps
 * time by, or none when the store keeps its own (Redis).
 */
function contract(name: string, make: () => Promise<{ sut: ResultStore; clock: ManualClock | undefined }>) {
  describe(`ResultStore contract: ${name}`, () => {
    let sut: ResultStore;
    let clock: ManualClock | undefined;
    beforeEach(async () => {
      ({ sut, clock } = await make());
    });

    it('returns what was stored under the same key', async () => {
      const key = randomBytes(32);
      await sut.set(key, Buffer.from('value'), 60_000);
      expect((await sut.get(key))?.toString()).toBe('value');
    });

    it('misses a key never stored', async () => {
      expect(await sut.get(randomBytes(32))).toBeUndefined();
    });

    it('overwrites an entry', async () => {
      const key = randomBytes(32);
      await sut.set(key, Buffer.from('one'), 60_000);
      await sut.set(key, Buffer.from('two'), 60_000);
      expect((await sut.get(key))?.toString()).toBe('two');
    });

    it('forgets an entry after its time to live', async () => {
      const key = randomBytes(32);
      await sut.set(key, Buffer.from('short'), 30);
      if (clock !== undefined) {
        clock.advance(29);
        expect((await sut.get(key))?.toString()).toBe('short');
        clock.advance(2);
        expect(await sut.get(key)).toBeUndefined();
      } else {
        // Redis expires keys on its own clock: wait for it.
        await eventually(async () => (await sut.get(key)) === undefined);
      }
    });

    it('keeps binary values byte for byte', async () => {
      const key = randomBytes(32);
      const value = randomBytes(4096);
      await sut.set(key, value, 60_000);
      expect(Buffer.compare((await sut.get(key))!, value)).toBe(0);
    });
  });
}

contract('embedded', async () => {
  const clock = new ManualClock();
  return { sut: new EmbeddedResultStore(1024 * 1024, clock), clock };
});

let redisServer: RedisServer;
const clients: Redis[] = [];
beforeAll(async () => {
  redisServer = await startRedisServer();
});
afterAll(async () => {
  for (const client of clients) client.disconnect();
  await redisServer.stop();
});
contract('redis', async () => {
  const client = createRedisClient(redisServer.url, logger, 'test');
  clients.push(client);
  await waitForRedis(client, 5_000);
  return { sut: new RedisResultStore(client, `test:${randomBytes(4).toString('hex')}:`), clock: undefined };
});

describe(EmbeddedResultStore.name, () => {
  /** What an entry of a 32-byte key (44 base64 characters) and `bytes` bytes is charged. */
  const charge = (bytes: number) => bytes + 88 + ENTRY_OVERHEAD_BYTES;

  it('evicts the least recently used entries to stay within its byte budget', async () => {
    const sut = new EmbeddedResultStore(charge(100) + charge(150) + 50);
    const [a, b, c] = [randomBytes(32), randomBytes(32), randomBytes(32)];
    await sut.set(a, Buffer.alloc(100), 60_000);
    await sut.set(b, Buffer.alloc(100), 60_000);
    await sut.get(a); // a is now more recent than b
    await sut.set(c, Buffer.alloc(150), 60_000);
    expect(await sut.get(b)).toBeUndefined();
    expect(await sut.get(a)).toBeDefined();
    expect(await sut.get(c)).toBeDefined();
    expect(sut.heldBytes).toBe(charge(100) + charge(150));
  });

  it('keeps a value that is a view into a larger buffer (a pool slab, a received message) as a copy of its exact size', async () => {
    const sut = new EmbeddedResultStore(1 << 20);
    const key = randomBytes(32);
    const slab = Buffer.alloc(8192, 3);
    await sut.set(key, slab.subarray(100, 2_148), 60_000);

    const held = (await sut.get(key))!;
    expect(held.byteLength).toBe(2_048);
    expect(held.buffer.byteLength).toBe(2_048);
    expect(held.every((b) => b === 3)).toBe(true);
  });

  it('answers an entry for its time to live on the clock it is given, then drops it', async () => {
    const clock = new ManualClock();
    const sut = new EmbeddedResultStore(1 << 20, clock);
    const key = randomBytes(32);
    await sut.set(key, Buffer.alloc(100), 100);

    clock.advance(99);
    expect(await sut.get(key)).toBeDefined();
    clock.advance(2);
    expect(await sut.get(key)).toBeUndefined();
    expect(sut.heldBytes).toBe(0);
  });

  it('does not hold a value larger than its budget', async () => {
    const sut = new EmbeddedResultStore(charge(100));
    const key = randomBytes(32);
    await sut.set(key, Buffer.alloc(101), 60_000);
    expect(await sut.get(key)).toBeUndefined();
    expect(sut.heldBytes).toBe(0);
  });
});
