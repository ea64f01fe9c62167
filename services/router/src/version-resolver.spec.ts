import 'reflect-metadata';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { Abstract, DynamicModule, INestApplicationContext, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Clock } from '@infermesh/clock';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { HealthDetails } from '@infermesh/runtime';
import {
  eventually,
  type FakeRegistry,
  freePort,
  ManualClock,
  rpcRejection,
  startFakeRegistry,
} from '@infermesh/testing';
import { loadRouterConfig } from './router.config';
import { RouterModule } from './router.module';
import { BatcherAdapter, CacheAdapter, RegistryAdapter } from './upstreams.adapter';
import { VersionResolver } from './version-resolver';

/**
 * A registry (another service, reached through RegistryAdapter) whose answers the test releases by
 * hand: each call waits until `answer` or `fail` settles it, and the latest version is `latest`.
 */
class FakeRegistryAdapter {
  readonly calls: { model: string; versionId: string }[] = [];
  latest = '1';
  private waiting: {
    resolve: (v: ModelVersion) => void;
    reject: (e: unknown) => void;
    model: string;
    versionId: string;
  }[] = [];
  /** When true, calls wait for answer()/fail(); otherwise they answer at once. */
  manual = false;

  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    this.calls.push({ model, versionId });
    if (!this.manual) return this.version(model, versionId);
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject, model, versionId }));
  }

  /** The model with one READY version, the latest; recorded as a lookup without a version id. */
  async getModel(model: string): Promise<Model> {
    const version = await this.resolve(model, '');
    return create(ModelSchema, { name: `models/${model}`, versions: [version] });
  }

  answer(): void {
    for (const w of this.waiting.splice(0)) w.resolve(this.version(w.model, w.versionId));
  }

  fail(error: unknown): void {
    for (const w of this.waiting.splice(0)) w.reject(error);
  }

  private version(model: string, versionId: string): ModelVersion {
    return create(ModelVersionSchema, {
      name: `models/${model}/versions/${versionId || this.latest}`,
      state: VersionState.READY,
    });
  }
}

const unused = {};

const watchedVersion = (model: string, id: string, state: VersionState) => ({
  name: `models/${model}/versions/${id}`,
  state,
});

describe(VersionResolver.name, () => {
  let app: INestApplicationContext;
  let registry: FakeRegistryAdapter;

  /**
   * Starts the router's Nest context; its registry watch follows `watchAddress`, by default an address
   * nothing listens on; its time is `clock` when given, else the system's.
   */
  async function start(resolveTtlMs: number, watchAddress?: string, clock?: Clock): Promise<VersionResolver> {
    registry = new FakeRegistryAdapter();
    const module = RouterModule.forRoot(
      loadRouterConfig({
        ROUTER_LOG_LEVEL: 'error',
        ROUTER_RESOLVE_TTL_MS: String(resolveTtlMs),
        ROUTER_REGISTRY_ADDRESS: watchAddress ?? `127.0.0.1:${await freePort()}`,
      }),
    );
    const replacements = new Map<Type | Abstract<unknown>, object>([
      [RegistryAdapter, registry],
      [CacheAdapter, unused],
      [BatcherAdapter, unused],
    ]);
    if (clock !== undefined) replacements.set(Clock, clock);
    const withFakes: DynamicModule = {
      ...module,
      providers: [
        ...(module.providers ?? []).filter((p) => !replacements.has(p as Type)),
        ...[...replacements].map(([provide, useValue]) => ({ provide, useValue })),
      ],
    };
    app = await NestFactory.createApplicationContext(withFakes, { logger: false, abortOnError: false });
    return app.get(VersionResolver);
  }

  afterEach(async () => {
    jest.restoreAllMocks();
    await app?.close();
  });

  it('reuses an answer within ROUTER_RESOLVE_TTL_MS, then serves it once more while it asks the registry again', async () => {
    const clock = new ManualClock();
    const sut = await start(500, undefined, clock);

    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    registry.latest = '2';
    clock.advance(499);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(1);

    clock.advance(2);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(2);
    await new Promise((r) => setImmediate(r));
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/2');
  });

  it('keeps serving the last answer while the registry is down', async () => {
    const clock = new ManualClock();
    const sut = await start(500, undefined, clock);
    await sut.resolve('mlp', '');
    const asked = registry.calls.length;
    registry.manual = true;

    clock.advance(60_000);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls.length).toBeGreaterThan(asked); // expired: asked again, in the background
    registry.fail(Errors.upstreamUnavailable('the registry is down'));
    await new Promise((r) => setImmediate(r));
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
  });

  it('remembers each model and version separately', async () => {
    const sut = await start(60_000);

    await sut.resolve('mlp', '');
    await sut.resolve('mlp', '1');
    await sut.resolve('other', '');
    await sut.resolve('mlp', '1');

    expect(registry.calls).toEqual([
      { model: 'mlp', versionId: '' },
      { model: 'mlp', versionId: '1' },
      { model: 'other', versionId: '' },
    ]);
  });

  it('asks the registry on every request when ROUTER_RESOLVE_TTL_MS is 0', async () => {
    const sut = await start(0);

    await sut.resolve('mlp', '');
    await sut.resolve('mlp', '');

    expect(registry.calls).toHaveLength(2);
  });

  it('coalesces concurrent lookups of the same model into one registry call', async () => {
    const sut = await start(0);
    registry.manual = true;

    const lookups = [sut.resolve('mlp', ''), sut.resolve('mlp', ''), sut.resolve('mlp', '')];
    const other = sut.resolve('mlp', '7');
    expect(registry.calls).toEqual([
      { model: 'mlp', versionId: '' },
      { model: 'mlp', versionId: '7' },
    ]);
    registry.answer();

    const names = (await Promise.all(lookups)).map((r) => r.version.name);
    expect(names).toEqual(['models/mlp/versions/1', 'models/mlp/versions/1', 'models/mlp/versions/1']);
    expect((await other).version.name).toBe('models/mlp/versions/7');
  });

  it('gives a failed lookup to every waiting caller and does not remember it', async () => {
    const sut = await start(60_000);
    registry.manual = true;

    const lookups = [sut.resolve('mlp', ''), sut.resolve('mlp', '')].map((p) =>
      p.then(
        () => undefined,
        (e: unknown) => e,
      ),
    );
    registry.fail(Errors.modelNotFound('model "mlp" not found'));
    for (const error of await Promise.all(lookups)) {
      expect(error).toBeInstanceOf(RpcError);
      expect((error as RpcError).code).toBe(status.NOT_FOUND);
    }

    registry.manual = false;
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(2);
  });

  describe('following the registry watch', () => {
    let watched: FakeRegistry;

    /** The router following `watched`, once its watch holds the first snapshot. */
    async function following(): Promise<VersionResolver> {
      const sut = await start(60_000, watched.address);
      await app.get(RegistryWatch).ready();
      return sut;
    }

    /** Waits until the router's watch has applied every change made so far. */
    async function applied(): Promise<void> {
      const watch = app.get(RegistryWatch);
      await eventually(() => watch.revision === watched.revision, 10_000, 5);
    }

    beforeEach(async () => {
      watched = await startFakeRegistry();
      watched.put({
        name: 'models/mlp',
        versions: [
          watchedVersion('mlp', '1', VersionState.READY),
          watchedVersion('mlp', '2', VersionState.READY),
          watchedVersion('mlp', '3', VersionState.LOADING),
        ],
        cache: { ttlMs: 5_000n },
      });
      watched.put({ name: 'models/cold', versions: [watchedVersion('cold', '1', VersionState.LOADING)] });
    });

    afterEach(async () => {
      await watched.stop();
    });

    it('resolves from the models the watch holds without asking the registry, and applies a change to the next request', async () => {
      const sut = await following();

      expect(await sut.resolve('mlp', '')).toMatchObject({
        version: { name: 'models/mlp/versions/2' },
        route: 'stable',
        cache: { ttlMs: 5_000n },
      });
      expect(await sut.resolve('mlp', '1')).toMatchObject({
        version: { name: 'models/mlp/versions/1' },
        route: 'explicit',
        cache: { ttlMs: 5_000n },
      });

      watched.put({
        name: 'models/mlp',
        versions: [watchedVersion('mlp', '2', VersionState.DRAINING), watchedVersion('mlp', '3', VersionState.READY)],
      });
      await applied();

      expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/3');
      expect(registry.calls).toEqual([]);
    });

    it('follows the rollout policy and the fallback model of the watched model', async () => {
      const sut = await following();
      watched.put({
        name: 'models/mlp',
        versions: [watchedVersion('mlp', '1', VersionState.READY), watchedVersion('mlp', '2', VersionState.READY)],
        rollout: { stableVersion: '1', shadow: { version: '2', percent: 100 }, fallbackModel: 'cold' },
      });
      await applied();

      const resolved = await sut.resolve('mlp', '');

      expect(resolved).toMatchObject({
        version: { name: 'models/mlp/versions/1' },
        route: 'stable',
        shadow: { name: 'models/mlp/versions/2' },
      });
      expect(await sut.fallbackOf('mlp')).toBe('cold');
      expect(await sut.fallbackOf('cold')).toBe('');
      expect(registry.calls).toEqual([]);
    });

    it.each([
      ['an unknown version', 'mlp', '9', status.NOT_FOUND, 'VERSION_NOT_FOUND', 'model "mlp" has no version 9'],
      [
        'a version that is not READY',
        'mlp',
        '3',
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'version 3 of model "mlp" is LOADING, not READY',
      ],
      [
        'a version id that is not one',
        'mlp',
        'v1',
        status.INVALID_ARGUMENT,
        'INVALID_REQUEST',
        'invalid version id "v1": expected a positive integer such as "1"',
      ],
      [
        'a model with no READY version',
        'cold',
        '',
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'model "cold" has no READY version',
      ],
    ])('refuses %s as the registry would', async (_case, model, versionId, code, reason, message) => {
      const sut = await following();

      const error = await rpcRejection(sut.resolve(model, versionId));

      expect([error.code, error.reason, error.message]).toEqual([code, reason, message]);
      expect(registry.calls).toEqual([]);
    });

    it('refuses an unloaded model with UNAVAILABLE MODEL_NOT_READY, with or without a version, and serves it again once loaded', async () => {
      const sut = await following();
      watched.put({
        name: 'models/mlp',
        versions: [watchedVersion('mlp', '1', VersionState.DRAINING)],
        unloaded: true,
      });
      await applied();

      for (const versionId of ['', '1']) {
        const error = await rpcRejection(sut.resolve('mlp', versionId));
        expect([error.code, error.reason, error.message]).toEqual([
          status.UNAVAILABLE,
          'MODEL_NOT_READY',
          'model "mlp" is unloaded',
        ]);
      }

      watched.put({ name: 'models/mlp', versions: [watchedVersion('mlp', '1', VersionState.READY)] });
      await applied();
      expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    });

    it('asks the registry about a model the watch does not hold, and about a deleted one afresh', async () => {
      const sut = await following();

      expect((await sut.resolve('other', '')).version.name).toBe('models/other/versions/1');
      expect(registry.calls).toEqual([{ model: 'other', versionId: '' }]);

      watched.delete('models/mlp');
      await applied();
      expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
      expect((await sut.resolve('other', '')).version.name).toBe('models/other/versions/1');
      // The deletion cleared the answers remembered before it: "other" is asked again.
      expect(registry.calls).toEqual([
        { model: 'other', versionId: '' },
        { model: 'mlp', versionId: '' },
        { model: 'other', versionId: '' },
      ]);
    });

    it('keeps serving the last configuration while the registry is down, and says so in its health details', async () => {
      const sut = await following();
      const watch = app.get(RegistryWatch);

      await watched.stop();
      await eventually(() => !watch.status().connected, 10_000, 5);

      expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/2');
      expect(registry.calls).toEqual([]);
      expect(app.get(HealthDetails).report()['registry']).toMatchObject({
        address: watched.address,
        connected: false,
        revision: 2,
        serving_last_config: true,
        disconnected_for_ms: expect.any(Number),
      });
    });

    it('asks the registry until the watch has delivered its first message', async () => {
      const sut = await start(60_000);

      expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
      expect(registry.calls).toEqual([{ model: 'mlp', versionId: '' }]);
      expect(app.get(HealthDetails).report()['registry']).toMatchObject({
        connected: false,
        serving_last_config: false,
        models: 0,
      });
    });
  });
});
