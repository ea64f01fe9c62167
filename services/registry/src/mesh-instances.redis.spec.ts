import type { Clock } from '@infermesh/clock';
import type { MeshInstance } from '@infermesh/mesh';
import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import { JsonLogger } from '@infermesh/telemetry';
import { eventually, type RedisServer, startRedisServer, ManualClock } from '@infermesh/testing';
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

/** Two replicas of the registry, each with its own instances and its own Redis connection, against a real redis-server. */
describe(RedisInstanceMirror.name, () => {
  let redis: RedisServer;
  const logger = new JsonLogger('registry', 'error');
  const clients: Redis[] = [];
  const mirrors: RedisInstanceMirror[] = [];

  beforeAll(async () => {
    redis = await startRedisServer();
  });

  afterAll(async () => {
    await redis.stop();
  });

  afterEach(async () => {
    await Promise.all(mirrors.splice(0).map((m) => m.stop()));
    for (const client of clients.splice(0)) client.disconnect();
  });

  async function replica(
    name: string,
    ttlMs = 5_000,
    clock?: Clock,
  ): Promise<{ instances: MeshInstances; mirror: RedisInstanceMirror; client: Redis }> {
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
      50,
      logger,
      clock,
    );
    mirrors.push(mirror);
    mirror.start();
    return { instances, mirror, client };
  }

  it('each replica lists the instances announced to the others, and forgets them when their announcement ends', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    let bChanges = 0;
    b.instances.onChange(() => (bChanges += 1));

    const token = a.instances.announce(worker('worker-0'));
    b.instances.announce(worker('worker-1', '10.0.0.2'));

    await eventually(
      () => ids(b.instances).join() === 'worker-0,worker-1' && ids(a.instances).join() === 'worker-0,worker-1',
    );
    expect(b.instances.list().find((i) => i.id === 'worker-0')).toEqual(worker('worker-0'));
    expect(bChanges).toBeGreaterThanOrEqual(2);
    a.instances.withdraw('worker-0', token);
    await eventually(() => ids(b.instances).join() === 'worker-1');
  });

  it('a heartbeat that changes health reaches the other replicas', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    const token = a.instances.announce(worker('worker-0'));
    await eventually(() => b.instances.list().length === 1);

    a.instances.heartbeat('worker-0', token, false);

    await eventually(() => b.instances.list()[0]?.healthy === false);
  });

  it('an instance that moved to another replica stays when its old announcement ends late', async () => {
    const a = await replica('registry-a');
    const b = await replica('registry-b');
    const c = await replica('registry-c');
    const old = a.instances.announce(worker('worker-0', '10.0.0.1'));
    await eventually(() => c.instances.list()[0]?.address === '10.0.0.1');
    await new Promise((r) => setTimeout(r, 5));
    b.instances.announce(worker('worker-0', '10.0.0.9'));

    // While the old announcement on A lasts, A's refreshes do not overwrite the newer one: every
    // replica, A included, lists the instance where it announced itself last.
    await eventually(() =>
      [a, b, c].every(
        (r) =>
          r.instances
            .list()
            .map((i) => `${i.id}@${i.address}`)
            .join() === 'worker-0@10.0.0.9',
      ),
    );
    await new Promise((r) => setTimeout(r, 300));
    expect(
      [a, b, c].map((r) =>
        r.instances
          .list()
          .map((i) => i.address)
          .join(),
      ),
    ).toEqual(['10.0.0.9', '10.0.0.9', '10.0.0.9']);
    a.instances.withdraw('worker-0', old);

    // A's withdrawal removes only its own entry: the newer announcement, on B, is still listed.
    await new Promise((r) => setTimeout(r, 300));
    expect(c.instances.list().map((i) => `${i.id}@${i.address}`)).toEqual(['worker-0@10.0.0.9']);
  });

  it('the instances of a replica that died (no cleanup) expire after the instance timeout', async () => {
    const clock = new ManualClock(Date.now());
    const a = await replica('registry-a', 2_000, clock);
    const b = await replica('registry-b', 2_000, clock);
    a.instances.announce(worker('worker-0'));
    await eventually(() => b.instances.list().length === 1);

    // A loses Redis for good (as a killed process does): its entry stays there until it expires.
    a.client.disconnect();
    clock.advance(1_000);
    await new Promise((r) => setTimeout(r, 200));
    expect(b.instances.list()).toHaveLength(1);
    clock.advance(1_500);

    await eventually(() => b.instances.list().length === 0);
  });
});
