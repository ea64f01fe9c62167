import 'reflect-metadata';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { RegistryService, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { HealthDetails, RuntimeModule, runtimeSettings } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually as eventuallyWithin, type FakeRegistry, ManualClock, startFakeRegistry } from '@infermesh/testing';

/** The watch reconnects with backoff: give conditions ten seconds. */
const eventually = (condition: () => boolean) => eventuallyWithin(condition, 10_000, 5);
import { RegistryWatch } from './registry-watch';
import { registryWatchProvider } from './registry-watch.provider';

const mlp = { name: 'models/mlp', versions: [{ name: 'models/mlp/versions/1', state: VersionState.READY }] };
const tiny = { name: 'models/tiny', versions: [{ name: 'models/tiny/versions/1', state: VersionState.READY }] };

describe(RegistryWatch.name, () => {
  let registry: FakeRegistry;
  let client: ServiceClient<typeof RegistryService>;
  let sut: RegistryWatch;
  let metrics: Metrics;
  let logs: Record<string, unknown>[];
  let changes: string[][];

  function startWatch(address = `127.0.0.1:${registry.port}`, clock?: ManualClock): RegistryWatch {
    logs = [];
    changes = [];
    metrics = new Metrics('router');
    const logger = new JsonLogger('router', 'info', (line) => logs.push(JSON.parse(line) as Record<string, unknown>));
    client = createClient(RegistryService, address);
    sut = new RegistryWatch({ client, logger, metrics, address, backoff: { initialMs: 5, maxMs: 20 }, clock });
    sut.onChange((names) => changes.push([...names].sort()));
    sut.start();
    return sut;
  }

  async function metric(name: string): Promise<number> {
    const found = metrics.registry.getSingleMetric(`infermesh_router_${name}`);
    if (found === undefined) throw new Error(`no metric ${name}`);
    return (await found.get()).values[0]?.value ?? 0;
  }

  const messages = (level: string) => logs.filter((l) => l['level'] === level).map((l) => l['msg']);

  beforeEach(async () => {
    registry = await startFakeRegistry();
  });

  afterEach(async () => {
    await sut?.close();
    client?.close();
    await registry.stop();
  });

  it('holds the models of the first snapshot once ready, with its revision', async () => {
    registry.put(mlp);
    registry.put(tiny);
    startWatch();

    await sut.ready();

    expect(
      sut
        .models()
        .map((m) => m.name)
        .sort(),
    ).toEqual(['models/mlp', 'models/tiny']);
    expect(sut.model('mlp')?.versions[0]?.state).toBe(VersionState.READY);
    expect(sut.model('missing')).toBeUndefined();
    // What it holds is what the service may name in metric labels.
    expect([
      sut.hasModel('mlp'),
      sut.hasModel('missing'),
      sut.hasVersion('mlp', '1'),
      sut.hasVersion('mlp', '9'),
      sut.hasVersion('missing', '1'),
    ]).toEqual([true, false, true, false, false]);
    expect(sut.revision).toBe(2n);
    expect(sut.status()).toMatchObject({
      connected: true,
      synced: true,
      revision: 2n,
      lastError: undefined,
      disconnectedSince: undefined,
    });
    expect(changes).toEqual([['mlp', 'tiny']]);
    expect(registry.watchCalls).toEqual([0n]);
    expect(await metric('registry_watch_connected')).toBe(1);
    expect(await metric('registry_watch_revision')).toBe(2);
    expect(await metric('registry_watch_config_age_seconds')).toBe(0);
  });

  it('applies each change as it comes: a changed model replaces the one held, and only it is reported', async () => {
    registry.put(mlp);
    registry.put(tiny);
    startWatch();
    await sut.ready();
    const tinyBefore = sut.model('tiny');

    registry.put({ ...mlp, unloaded: true });
    await eventually(() => sut.revision === 3n);

    expect(sut.model('mlp')?.unloaded).toBe(true);
    expect(sut.model('tiny')).toBe(tinyBefore);
    expect(changes).toEqual([['mlp', 'tiny'], ['mlp']]);
  });

  it('drops a deleted model and reports it', async () => {
    registry.put(mlp);
    registry.put(tiny);
    startWatch();
    await sut.ready();

    registry.delete('models/mlp');
    await eventually(() => sut.revision === 3n);

    expect(sut.model('mlp')).toBeUndefined();
    expect(sut.hasModel('mlp')).toBe(false);
    expect(sut.models().map((m) => m.name)).toEqual(['models/tiny']);
    expect(changes.at(-1)).toEqual(['mlp']);
  });

  it('keeps its models while the registry is down, says so, and logs it once however many reconnects fail', async () => {
    registry.put(mlp);
    const clock = new ManualClock();
    startWatch(undefined, clock);
    await sut.ready();
    clock.advance(1_000); // connected a while: that time is no part of the outage

    await registry.stop();
    await eventually(() => !sut.status().connected);
    await eventually(() => registry.watchCalls.length === 1 && sut.status().lastError !== undefined);
    const lostAt = clock.now();
    // Several attempts, each after its backoff of at most 20 ms.
    for (let attempt = 1; attempt <= 3; attempt++) {
      await eventually(() => clock.pendingInMs().length === 1);
      expect(clock.pendingInMs()[0]).toBeLessThanOrEqual(20);
      clock.advance(20);
    }
    await eventuallyWithin(async () => (await metric('registry_watch_reconnects_total')) === 3);

    expect(sut.model('mlp')?.name).toBe('models/mlp');
    expect(sut.status()).toMatchObject({ connected: false, synced: true, revision: 1n, disconnectedSince: lostAt });
    expect(sut.healthSection()).toMatchObject({
      connected: false,
      revision: 1,
      models: 1,
      serving_last_config: true,
      disconnected_for_ms: 60,
    });
    expect(await metric('registry_watch_connected')).toBe(0);
    expect(await metric('registry_watch_config_age_seconds')).toBe(0.06);
    expect(messages('warn')).toEqual(['registry watch lost; serving the last configuration it saw and reconnecting']);
  });

  it('resumes from its last revision when the registry comes back: no snapshot when nothing changed meanwhile', async () => {
    registry.put(mlp);
    registry.put(tiny);
    startWatch();
    await sut.ready();
    const held = sut.model('mlp');
    await registry.stop();
    await eventually(() => !sut.status().connected);

    await registry.start(registry.port);
    await eventually(() => sut.status().connected);

    expect(registry.watchCalls.at(-1)).toBe(2n);
    expect(sut.model('mlp')).toBe(held);
    expect(changes).toEqual([['mlp', 'tiny']]);
    expect(messages('info')).toEqual(['registry watch connected', 'registry watch reconnected']);
    expect(messages('warn')).toHaveLength(1);
    expect(sut.healthSection()).toMatchObject({ connected: true, serving_last_config: false });
    expect(sut.healthSection()).not.toHaveProperty('disconnected_for_ms');
  });

  it('takes the snapshot of a registry that changed while it was away, dropping the models it no longer has', async () => {
    registry.put(mlp);
    registry.put(tiny);
    startWatch();
    await sut.ready();
    await registry.stop();
    await eventually(() => !sut.status().connected);
    registry.delete('models/tiny');
    registry.put({ ...mlp, pinned: true });

    await registry.start(registry.port);
    await eventually(() => sut.revision === 4n);

    expect(registry.watchCalls).toEqual([0n, ...registry.watchCalls.slice(1, -1), 2n]);
    expect(sut.models().map((m) => m.name)).toEqual(['models/mlp']);
    expect(sut.model('mlp')?.pinned).toBe(true);
    expect(changes.at(-1)).toEqual(['mlp', 'tiny']);
  });

  it('keeps trying a registry that is down when it starts, and is ready once it answers', async () => {
    const port = registry.port;
    await registry.stop();
    registry.put(mlp);
    startWatch(`127.0.0.1:${port}`);
    let ready = false;
    void sut.ready().then(() => (ready = true));
    await eventually(() => sut.status().lastError !== undefined);

    expect(ready).toBe(false);
    expect(sut.status()).toMatchObject({ connected: false, synced: false, revision: 0n });
    expect(sut.healthSection()).toMatchObject({ connected: false, serving_last_config: false, models: 0 });
    expect(messages('warn')).toEqual(['registry watch cannot reach the registry; retrying']);

    await registry.start(port);
    await sut.ready();
    expect(sut.model('mlp')?.name).toBe('models/mlp');
  });

  it('cancels its stream on close and does not reconnect', async () => {
    registry.put(mlp);
    const clock = new ManualClock();
    startWatch(undefined, clock);
    await sut.ready();
    expect(registry.open).toBe(1);

    await sut.close();
    await eventually(() => registry.open === 0);

    // close() returns once the watch has stopped: no reconnect is waiting to happen.
    expect(clock.pendingInMs()).toEqual([]);
    clock.advance(60_000);
    expect(registry.watchCalls).toHaveLength(1);
    expect(sut.model('mlp')?.name).toBe('models/mlp');
    expect(messages('warn')).toEqual([]);
  });

  it('reports a listener that throws without stopping the others or the watch', async () => {
    registry.put(mlp);
    startWatch();
    sut.onChange(() => {
      throw new Error('listener broke');
    });
    const later: string[][] = [];
    sut.onChange((names) => later.push([...names]));
    await sut.ready();

    registry.put(tiny);
    await eventually(() => sut.revision === 2n);

    expect(later).toEqual([['mlp'], ['tiny']]);
    expect(logs.filter((l) => l['msg'] === 'a registry watch listener failed')).toHaveLength(2);
  });
});

describe(registryWatchProvider.name, () => {
  let registry: FakeRegistry;

  beforeEach(async () => {
    registry = await startFakeRegistry();
  });

  afterEach(async () => {
    await registry.stop();
  });

  it('follows the registry from the moment the application is built, reports in the health details, and closes its stream on shutdown', async () => {
    registry.put(mlp);
    const settings = runtimeSettings('ROUTER', {
      ROUTER_GRPC_HOST: '127.0.0.1',
      ROUTER_GRPC_PORT: 0,
      ROUTER_METRICS_HOST: '127.0.0.1',
      ROUTER_METRICS_PORT: 0,
      ROUTER_LOG_LEVEL: 'error',
      ROUTER_SHUTDOWN_GRACE_MS: 100,
      ROUTER_MAX_MESSAGE_BYTES: 1 << 20,
    });
    @Module({
      imports: [RuntimeModule.forRoot('router', settings)],
      providers: [registryWatchProvider(`127.0.0.1:${registry.port}`)],
    })
    class AppModule {}
    const app = await NestFactory.createApplicationContext(AppModule, { logger: false });
    const sut = app.get(RegistryWatch);
    await sut.ready();

    expect(sut.model('mlp')?.name).toBe('models/mlp');
    expect(registry.open).toBe(1);
    expect(app.get(HealthDetails).report()['registry']).toMatchObject({
      address: `127.0.0.1:${registry.port}`,
      connected: true,
      revision: 1,
      models: 1,
    });

    const details = app.get(HealthDetails);
    await app.close();
    await eventually(() => registry.open === 0);
    expect(details.report()).not.toHaveProperty('registry');
    expect(registry.watchCalls).toEqual([0n]);
  });
});
