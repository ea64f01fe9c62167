import { DEFAULT_RESTART_POLICY } from '@infermesh/system';
import { eventually } from '@infermesh/testing';
import { join } from 'node:path';
import {
  API_KEY,
  type Fixture,
  inferTinyDistinct,
  metricValue,
  REPO_ROOT,
  startFixture,
} from './support/system-fixture';

/**
 * Two routers in the mesh share the embedded result cache, each told which keys it holds
 * (CacheService.WatchKeys): a new key is served without a lookup, a key either router stored is
 * answered from the cache through the other, and while the cache is killed and restarted under load
 * no request is lost and the routers look every key up until the new cache says which it holds.
 */
describe('routers told which keys the result cache holds', () => {
  let fixture: Fixture;
  const routers = [0, 1];
  const routerMetric = (index: number, name: string, labels: Record<string, string> = {}) =>
    metricValue(fixture.system.instanceMetricsUrl('router', index), `infermesh_router_${name}`, labels);
  const bothKnowKeys = async () =>
    (await Promise.all(routers.map((i) => routerMetric(i, 'cache_keys_known')))).every((v) => v === 1);

  /** Infers `tiny` on [seed, 7, 8, 9] over REST: whether the answer came from the cache. */
  async function cached(seed: number): Promise<boolean> {
    const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [seed, 7, 8, 9] }] }),
    });
    expect(res.status).toBe(200);
    return ((await res.json()) as { parameters?: { cached?: boolean } }).parameters?.cached === true;
  }

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: join(REPO_ROOT, 'envoy', 'mesh.yaml'),
      replicas: { router: [{}, {}] },
      restartPolicy: DEFAULT_RESTART_POLICY,
      // Every repeated key reaches the shared cache, not a router's own.
      env: { ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  it('serves new keys without a lookup, and answers from the cache through either router a key the other stored', async () => {
    // A router whose first watches found no cache (still starting) tries again after 0.5, 1, 2, 4 … s
    // (KEY_WATCH_BACKOFF, up to 30 s): on a slow start that can be well after the system is up.
    await eventually(bothKnowKeys, 40_000);
    const skippedBefore = await Promise.all(routers.map((i) => routerMetric(i, 'cache_lookups_skipped_total')));
    const hitsBefore = await Promise.all(
      routers.map((i) => routerMetric(i, 'cache_requests_total', { outcome: 'hit' })),
    );
    const seeds = Array.from({ length: 40 }, (_, i) => 1_000 + i);

    for (const seed of seeds) expect(await cached(seed)).toBe(false);
    const skipped = await Promise.all(routers.map((i) => routerMetric(i, 'cache_lookups_skipped_total')));
    // Every one of them new: not asked about, whichever router served it; both served some.
    expect(skipped[0]! - skippedBefore[0]! + (skipped[1]! - skippedBefore[1]!)).toBe(seeds.length);
    for (const i of routers) expect(skipped[i]!).toBeGreaterThan(skippedBefore[i]!);

    // Once the stores reached the cache and it told both routers (its digest every 50 ms), every
    // key is answered from the cache: about half through the router that did not store it.
    await eventually(
      async () =>
        (await metricValue(fixture.system.metricsUrl('cache'), 'infermesh_cache_stores_total', {
          outcome: 'stored',
        })) >= seeds.length,
      10_000,
    );
    await new Promise((r) => setTimeout(r, 1_000));
    for (const seed of seeds) expect(await cached(seed)).toBe(true);
    for (const i of routers) {
      expect(await routerMetric(i, 'cache_requests_total', { outcome: 'hit' })).toBeGreaterThan(hitsBefore[i]!);
    }
  }, 90_000);

  it('loses no request of 16 closed-loop clients while the cache is killed and restarted, and the routers learn the new cache’s keys', async () => {
    const victim = fixture.system.process('cache');
    const pid = victim.pid!;
    const statuses: number[] = [];
    const end = Date.now() + 15_000;
    const clients = Array.from({ length: 16 }, async () => {
      while (Date.now() < end) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    await new Promise((r) => setTimeout(r, 4_000));
    process.kill(pid, 'SIGKILL');
    await eventually(async () => !(await bothKnowKeys()), 10_000);
    await Promise.all(clients);

    const failed = statuses.filter((s) => s !== 200);
    console.log(
      `cache killed by SIGKILL 4 s in: ${statuses.length} requests at c=16 over 15 s through two routers, ${failed.length} failed`,
    );
    expect(failed).toEqual([]);
    expect(victim.pid).not.toBe(pid);
    // Told again by the restarted cache, which holds nothing from before.
    await eventually(bothKnowKeys, 60_000);
    expect(await cached(1_000)).toBe(false);
    await eventually(() => cached(1_000), 5_000, 50);
  }, 120_000);
});
