import type { MeshInstance } from '@infermesh/mesh';
import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import { JsonLogger } from '@infermesh/telemetry';
import { ManualClock, type RedisServer, startRedisServer } from '@infermesh/testing';
import { MeshInstances } from './mesh-instances';
import { RedisInstanceMirror } from './mesh-instances.redis';

const worker = (id: string, address = '10.0.0.1'): MeshInstance => ({
  service: 'worker',
  id,
  address,
  port: 15006,
  labels: {},
  healthy: true,
});
const ids = (instances: MeshInstances) => instances.list().map((i) => i.id);

/** How often each replica reads the others' instances: one period of the specs' clock. */
const POLL_MS = 50;

/**
 * Replicas of the registry, each with its own instances and its own Redis connection, against a real
 * redis-server, on one ManualClock: they read each other's instances when the spec moves the clock on
 * (sync), and the spec waits for the Redis round trips that start (settled), never for time.
 */
describe(RedisInstanceMirror.name, () => {
  let redis: RedisServer;
  const logger = new JsonLogger('registry', 'error');
  const clients: Redis[] = [];
  const mirrors: RedisInstanceMirror[] = [];
  let clock: ManualClock;

  beforeAll(async () => {
    redis = await startRedisServer();
  });

  afterAll(async () => {
    await redis.stop();
  });

  beforeEach(() => {
    clock = new ManualClock();
  });

  afterEach(async () => {
    await Promise.all(mirrors.splice(0).map((m) => m.stop()));
    for (const client of clients.splice(0)) client.disconnect();
  });

  type Replica = { instances: MeshInstances; mirror: RedisInstanceMirror; client: Redis };

  async function replica(name: string, ttlMs = 60_000): Promise<Replica> {
    const client = createRedisClient(redis.url, logger, name);
    await waitForRedis(client, 5_000);
    clients.push(client);
    const instances = new MeshInstances(ttlMs, clock);
    const mirror = new RedisInstanceMirror(
      instances,
      client,
      `test-${expect.getState().currentTestName?.replace(/\W+/g, '-')}:`,
      name,
      ttlMs,
      POLL_MS,
      logger,
      clock,
    );
    mirrors.push(mirror);
    mirror.start();
    await mirror.settled();
    return { instances, mirror, client };
  }

  /** Every replica has written what changed on it; then one poll period passes and each has read the others. */
  async function sync(...replicas: Replica[]): Promise<void> {
    await Promise.all(replicas.map((r) => r.mirror.settled()));
    clock.advance(POLL_MS);
    await Promise.all(replicas.map((r) => r.mirror.settled()));
  }

  const listed = (r: Replica) =>
    r.instances
      .list()
      .map((i) => `${i.id}@${i.address}`)
      .join();

  it('each replica lists the instances announced to the others, and forgets them when their announcement ends', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    let bChanges = 0;
    b.instances.onChange(() => (bChanges += 1));

    const token = a.instances.announce(worker('worker-0'));
    b.instances.announce(worker('worker-1', '10.0.0.2'));
    await sync(a, b);

    expect([ids(a.instances).join(), ids(b.instances).join()]).toEqual(['worker-0,worker-1', 'worker-0,worker-1']);
    expect(b.instances.list().find((i) => i.id === 'worker-0')).toEqual(worker('worker-0'));
    expect(bChanges).toBeGreaterThanOrEqual(2);
    a.instances.withdraw('worker-0', token);
    await sync(a, b);
    expect(ids(b.instances)).toEqual(['worker-1']);
  });

  it('a heartbeat that changes health reaches the other replicas', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    const token = a.instances.announce(worker('worker-0'));
    await sync(a, b);
    expect(b.instances.list()).toHaveLength(1);

    a.instances.heartbeat('worker-0', token, false);
    await sync(a, b);

    expect(b.instances.list()[0]?.healthy).toBe(false);
  });

  it('an instance that moved to another replica stays when its old announcement ends late', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    const c = await replica('registry-c');
    const old = a.instances.announce(worker('worker-0', '10.0.0.1'));
    await sync(a, b, c);
    expect(listed(c)).toBe('worker-0@10.0.0.1');
    clock.advance(5);
    b.instances.announce(worker('worker-0', '10.0.0.9'));

    // While the old announcement on A lasts, A's refreshes do not overwrite the newer one: every
    // replica, A included, lists the instance where it announced itself last, poll after poll.
    for (let poll = 0; poll < 3; poll += 1) {
      await sync(a, b, c);
      expect([a, b, c].map(listed)).toEqual(['worker-0@10.0.0.9', 'worker-0@10.0.0.9', 'worker-0@10.0.0.9']);
    }
    a.instances.withdraw('worker-0', old);

    // A's withdrawal removes only its own entry: the newer announcement, on B, is still listed.
    await sync(a, b, c);
    await sync(a, b, c);
    expect(c.instances.list().map((i) => `${i.id}@${i.address}`)).toEqual(['worker-0@10.0.0.9']);
  });

  it('the instances of a replica that died (no cleanup) expire after the instance timeout', async () => {
    const a = await replica('registry-a', 2_000);
    const b = await replica('registry-b', 2_000);
    a.instances.announce(worker('worker-0'));
    await sync(a, b);
    expect(b.instances.list()).toHaveLength(1);

    // A loses Redis for good (as a killed process does): its entry stays there until it expires.
    a.client.disconnect();
    clock.advance(1_000);
    await sync(b);
    expect(b.instances.list()).toHaveLength(1);
    clock.advance(1_000);
    await sync(b);

    expect(b.instances.list()).toHaveLength(0);
  });
});
