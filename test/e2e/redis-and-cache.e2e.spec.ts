import { createClient } from '@infermesh/grpc';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { type RedisServer, startRedisServer } from '@infermesh/testing';
import { API_KEY, type Fixture, metricValue, startFixture } from './support/system-fixture';

describe('serving with Redis stores and the result cache', () => {
  let redis: RedisServer;
  let fixture: Fixture;
  let url: string;

  beforeAll(async () => {
    redis = await startRedisServer();
    // The router's own cache off: every repeated request goes to the shared cache in Redis.
    fixture = await startFixture({
      models: ['tiny'],
      redisUrl: redis.url,
      env: { ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
    url = fixture.system.gatewayUrl;
  });

  afterAll(async () => {
    await fixture?.stop();
    await redis?.stop();
  });

  const infer = async (data: number[]) => {
    const res = await fetch(`${url}/v2/models/tiny/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data }] }),
    });
    expect(res.status).toBe(200);
    return (await res.json()) as {
      model_version: string;
      parameters?: Record<string, unknown>;
      outputs: { data: number[] }[];
    };
  };

  it('serves the model registered in Redis', async () => {
    const res = await fetch(`${url}/v2/repository/index`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(await res.json()).toEqual([{ name: 'tiny', version: '1', state: 'READY' }]);
  });

  it('loses nothing when the registry restarts: models, versions, policies and revisions come back from Redis', async () => {
    const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    try {
      await registry.updateModel({
        model: {
          name: 'models/tiny',
          labels: { team: 'e2e' },
          versionPolicy: { policy: { case: 'latest', value: 2 } },
        },
        updateMask: { paths: ['labels', 'version_policy'] },
      });
      await registry.setCachePolicy({ model: 'models/tiny', policy: { ttlMs: 60_000n } });
      const before = (await registry.listModels({})).models;
      const pid = fixture.system.process('registry').pid;

      await fixture.system.process('registry').kill();
      await fixture.system.restart('registry');

      expect(fixture.system.process('registry').pid).not.toBe(pid);
      expect((await registry.listModels({})).models).toEqual(before);
      expect(before[0]).toMatchObject({ labels: { team: 'e2e' }, cache: { ttlMs: 60_000n } });
    } finally {
      registry.close();
    }
  });

  it('answers a repeated identical request from the cache, visible in the cache service metrics', async () => {
    const cacheMetrics = fixture.system.metricsUrl('cache');
    const hitsBefore = await metricValue(cacheMetrics, 'infermesh_cache_lookups_total', { outcome: 'hit' });
    const first = await infer([0.5, 1, 1.5, 2]);
    expect(first.parameters?.['cached']).not.toBe(true);
    // The store is asynchronous: wait until the entry is there.
    let second = await infer([0.5, 1, 1.5, 2]);
    for (let i = 0; i < 20 && second.parameters?.['cached'] !== true; i++) {
      await new Promise((r) => setTimeout(r, 50));
      second = await infer([0.5, 1, 1.5, 2]);
    }
    expect(second.parameters?.['cached']).toBe(true);
    expect(second.outputs).toEqual(first.outputs);
    expect(second.model_version).toBe('1');
    expect(await metricValue(cacheMetrics, 'infermesh_cache_lookups_total', { outcome: 'hit' })).toBeGreaterThan(
      hitsBefore,
    );

    const different = await infer([0.5, 1, 1.5, 2.5]);
    expect(different.parameters?.['cached']).not.toBe(true);
  });

  it('fails no inference when Redis dies mid-run: the last configuration serves, the cache answers misses', async () => {
    const statuses: number[] = [];
    let seq = 0;
    const run = (async () => {
      for (const end = Date.now() + 4_000; Date.now() < end;) {
        seq += 1;
        const res = await fetch(`${url}/v2/models/tiny/infer`, {
          method: 'POST',
          headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
          body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [seq, 7, 8, 9] }] }),
        });
        await res.arrayBuffer();
        statuses.push(res.status);
      }
    })();
    await new Promise((r) => setTimeout(r, 500));
    await redis.stop();
    await run;

    expect(statuses.length).toBeGreaterThan(10);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    // The cache service answered its failed Redis lookups as misses.
    expect(
      await metricValue(fixture.system.metricsUrl('cache'), 'infermesh_cache_lookups_total', { outcome: 'error' }),
    ).toBeGreaterThan(0);
  });
});
