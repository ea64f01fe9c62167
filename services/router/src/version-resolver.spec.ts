import 'reflect-metadata';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { DynamicModule, INestApplicationContext, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { RpcError } from '@infermesh/grpc';
import { type Model, ModelSchema, type ModelVersion, ModelVersionSchema, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { loadRouterConfig } from './router.config';
import { RouterModule } from './router.module';
import { BatcherAdapter, CacheAdapter, RegistryAdapter } from './upstreams.adapter';
import { VersionResolver } from './version-resolver';

/**
 * A registry (another service, reached through RegistryAdapter) whose answers the test releases by
 * hand: each call waits until `answer` or `fail` settles it, and the latest version is `latest`.
 */
class FakeRegistry {
  readonly calls: { model: string; versionId: string }[] = [];
  latest = '1';
  private waiting: { resolve: (v: ModelVersion) => void; reject: (e: unknown) => void; model: string; versionId: string }[] = [];
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
    return create(ModelVersionSchema, { name: `models/${model}/versions/${versionId || this.latest}`, state: VersionState.READY });
  }
}

const unused = {};

describe(VersionResolver.name, () => {
  let app: INestApplicationContext;
  let registry: FakeRegistry;

  async function start(resolveTtlMs: number): Promise<VersionResolver> {
    registry = new FakeRegistry();
    const module = RouterModule.forRoot(loadRouterConfig({ ROUTER_LOG_LEVEL: 'error', ROUTER_RESOLVE_TTL_MS: String(resolveTtlMs) }));
    const replacements = new Map<Type, object>([
      [RegistryAdapter, registry],
      [CacheAdapter, unused],
      [BatcherAdapter, unused],
    ]);
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
    const now = jest.spyOn(Date, 'now').mockReturnValue(1_000_000);
    const sut = await start(500);

    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    registry.latest = '2';
    now.mockReturnValue(1_000_499);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(1);

    now.mockReturnValue(1_000_501);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(2);
    await new Promise((r) => setImmediate(r));
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/2');
  });

  it('keeps serving the last answer while the registry is down', async () => {
    const now = jest.spyOn(Date, 'now').mockReturnValue(1_000_000);
    const sut = await start(500);
    await sut.resolve('mlp', '');
    registry.manual = true;

    now.mockReturnValue(1_060_000);
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    registry.fail(RpcError.unavailable('the registry is down'));
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
    registry.fail(RpcError.notFound('model "mlp" not found', 'MODEL_NOT_FOUND'));
    for (const error of await Promise.all(lookups)) {
      expect(error).toBeInstanceOf(RpcError);
      expect((error as RpcError).code).toBe(status.NOT_FOUND);
    }

    registry.manual = false;
    expect((await sut.resolve('mlp', '')).version.name).toBe('models/mlp/versions/1');
    expect(registry.calls).toHaveLength(2);
  });
});
