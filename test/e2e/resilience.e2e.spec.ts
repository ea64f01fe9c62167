import { createClient } from '@infermesh/grpc';
import { buildTinyModel } from '@infermesh/model-builder';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { registerModel, type ServiceName } from '@infermesh/system';
import { API_KEY, type Fixture, startFixture } from './support/system-fixture';

describe('killing one service at a time', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({ models: ['tiny'], env: { ROUTER_RESOLVE_TTL_MS: '200' } });
  });

  afterAll(async () => {
    await fixture?.stop();
  });

  let seq = 0;
  /** A request that is never the same twice, so the result cache cannot answer it. */
  const infer = async () => {
    seq += 1;
    const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [seq, 1, 2, 3] }] }),
      signal: AbortSignal.timeout(20_000),
    });
    return { status: res.status, body: (await res.json()) as { error?: string; model_version?: string } };
  };

  /** Polls until a request gets the wanted status; returns the last response. */
  const eventually = async (status: number, timeoutMs = 15_000) => {
    const deadline = Date.now() + timeoutMs;
    let last = await infer();
    while (last.status !== status && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      last = await infer();
    }
    return last;
  };

  it('serves before anything is killed', async () => {
    expect((await infer()).status).toBe(200);
  });

  it.each<ServiceName>(['worker', 'batcher', 'router'])(
    'answers 503 while the %s is down and recovers when it is back, without restarting the others',
    async (service) => {
      const others = ['registry', 'cache', 'worker', 'batcher', 'router', 'gateway'].filter(
        (s) => s !== service,
      ) as ServiceName[];
      const pids = others.map((s) => fixture.system.process(s).pid);
      await fixture.system.process(service).kill();
      const down = await eventually(503);
      expect(down.status).toBe(503);
      expect(down.body.error).toEqual(expect.any(String));
      await fixture.system.restart(service);
      const back = await eventually(200, 30_000);
      expect(back.status).toBe(200);
      expect(others.map((s) => fixture.system.process(s).pid)).toEqual(pids);
    },
  );

  it('keeps serving for 60 s with the last configuration while the registry is down, and follows it again once it is back', async () => {
    const others = ['cache', 'worker', 'batcher', 'router', 'gateway'] as ServiceName[];
    const pids = others.map((s) => fixture.system.process(s).pid);
    await fixture.system.process('registry').kill();
    // Far past ROUTER_RESOLVE_TTL_MS (200 ms) and the worker's sync interval: every answer comes
    // from what the data plane last saw.
    const statuses: number[] = [];
    for (const end = Date.now() + 60_000; Date.now() < end;) {
      statuses.push((await infer()).status);
      await new Promise((r) => setTimeout(r, 50));
    }
    const failed = statuses.filter((s) => s !== 200);
    console.log(`registry down for 60 s: ${statuses.length} requests, ${failed.length} failed`);
    expect(statuses.length).toBeGreaterThan(300);
    expect(failed).toEqual([]);

    await fixture.system.restart('registry');
    // The followers catch up without a restart of their own: a version registered now serves.
    const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    try {
      await registerModel(registry, 'tiny', '2', buildTinyModel().bytes);
      let served = await infer();
      for (const end = Date.now() + 20_000; served.body.model_version !== '2' && Date.now() < end;) {
        await new Promise((r) => setTimeout(r, 100));
        served = await infer();
      }
      expect(served).toMatchObject({ status: 200, body: { model_version: '2' } });
    } finally {
      registry.close();
    }
    expect(others.map((s) => fixture.system.process(s).pid)).toEqual(pids);
  }, 120_000);

  it('keeps serving without caching while the cache is down', async () => {
    await fixture.system.process('cache').kill();
    for (let i = 0; i < 5; i++) expect((await infer()).status).toBe(200);
    await fixture.system.restart('cache');
    expect((await infer()).status).toBe(200);
  });
});
