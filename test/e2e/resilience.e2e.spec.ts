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

  it('loses no request while the cache is frozen, killed and restarted under load, then answers from it again', async () => {
    // The router's lookups travel on one stream to the cache: a cache that stops answering (SIGSTOP)
    // must cost lookups their timeout, one that dies must fail the stream's lookups over to the
    // model, and the restarted one must be found again by a new stream.
    const outcomes = { ok: 0, failed: [] as string[] };
    let running = true;
    const clients = Array.from({ length: 4 }, async () => {
      while (running) {
        const { status, body } = await infer();
        if (status === 200) outcomes.ok += 1;
        else outcomes.failed.push(`${status} ${body.error ?? ''}`);
      }
    });
    const cache = () => fixture.system.process('cache');
    const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
    try {
      await pause(500);
      process.kill(cache().pid!, 'SIGSTOP');
      await pause(1_500);
      process.kill(cache().pid!, 'SIGCONT');
      await pause(500);
      await cache().kill();
      await pause(1_500);
      await fixture.system.restart('cache');
      await pause(1_000);
    } finally {
      running = false;
      await Promise.all(clients);
    }
    expect(outcomes.failed).toEqual([]);
    expect(outcomes.ok).toBeGreaterThan(50);

    // The same request twice: the second is answered from a cache (the router's own, or the
    // restarted service, whichever has it) — the first was stored through the new stream.
    const body = { inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [-1, -2, -3, -4] }] };
    const once = async () => {
      const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
        method: 'POST',
        headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return (await res.json()) as { parameters?: { cached?: boolean } };
    };
    expect((await once()).parameters?.cached).toBe(false);
    expect((await once()).parameters?.cached).toBe(true);
    const lookups = await fetch(fixture.system.metricsUrl('cache')).then((r) => r.text());
    expect(lookups).toMatch(
      /grpc_server_handling_seconds_count\{[^}]*method="CacheService\/Lookup"[^}]*code="OK"[^}]*\} [1-9]/,
    );
  }, 60_000);
});
