import 'reflect-metadata';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { Abstract, DynamicModule, INestApplicationContext, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Clock } from '@infermesh/clock';
import { GrpcServer, RpcError, type ServiceImpl, Errors } from '@infermesh/grpc';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  type CachePolicySchema,
  type RolloutPolicySchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, Metrics, requestContext } from '@infermesh/telemetry';
import { cacheKey } from '@infermesh/tensors';
import { eventually, freePort, ManualClock, rpcRejection, unlistedKeys } from '@infermesh/testing';
import { stickyBucket } from '@infermesh/rollout';
import { InferenceRouter } from './inference-router';
import { loadRouterConfig } from './router.config';
import { RouterModule } from './router.module';
import { BatcherAdapter, CacheAdapter, RegistryAdapter } from './upstreams.adapter';

// ---------------------------------------------------------------------------------------------
// Fakes of the router's three upstreams (registry, result cache, batcher): other services, reached
// through the adapters in upstreams.adapter.ts, which are the seam replaced here.
// ---------------------------------------------------------------------------------------------

const signature = {
  inputs: [{ name: 'x', datatype: DataType.FP32, shape: [-1n, 4n] }],
  outputs: [
    { name: 'y', datatype: DataType.FP32, shape: [-1n, 2n] },
    { name: 'z', datatype: DataType.FP32, shape: [-1n] },
  ],
  maxBatchSize: 8,
};

const version = (model: string, id: string, state: VersionState): ModelVersion =>
  create(ModelVersionSchema, {
    name: `models/${model}/versions/${id}`,
    state,
    signature,
    artifact: { sha256: `sha256-of-${model}-${id}` },
  });

/** What the registry holds: mlp has 1 and 2 READY, 3 still LOADING; cold has nothing ready. */
const MODELS: Record<string, ModelVersion[]> = {
  mlp: [
    version('mlp', '1', VersionState.READY),
    version('mlp', '2', VersionState.READY),
    version('mlp', '3', VersionState.LOADING),
  ],
  cold: [version('cold', '1', VersionState.LOADING)],
  frozen: [version('frozen', '1', VersionState.LOADING)],
  ab: [version('ab', '1', VersionState.READY), version('ab', '2', VersionState.READY)],
  sh: [version('sh', '1', VersionState.READY), version('sh', '2', VersionState.READY)],
  uncached: [version('uncached', '1', VersionState.READY)],
  small: [version('small', '1', VersionState.READY)],
};

/** Cache policies by model: uncached is never cached; small keeps entries 5 s and none over 4 bytes. */
const CACHES: Record<string, MessageInitShape<typeof CachePolicySchema>> = {
  uncached: { enabled: false },
  small: { ttlMs: 5_000n, maxEntryBytes: 4n },
};

/** Rollout policies by model: ab sends half of its routing keys to version 2, the rest to version 1. */
const ROLLOUTS: Record<string, MessageInitShape<typeof RolloutPolicySchema>> = {
  sh: { stableVersion: '1', shadow: { version: '2', percent: 100 } },
  frozen: { fallbackModel: 'mlp' },
  ab: { stableVersion: '1', variants: [{ version: '2', percent: 50 }], fallbackModel: 'mlp' },
};

/** Answers like the registry's ResolveModelVersion: no version id means the latest READY one. */
class FakeRegistry {
  readonly calls: { model: string; versionId: string }[] = [];

  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    this.calls.push({ model, versionId });
    const versions = MODELS[model];
    if (versions === undefined) throw Errors.modelNotFound(`model "${model}" not found`);
    if (versionId === '') {
      const ready = versions.findLast((v) => v.state === VersionState.READY);
      if (ready === undefined) throw Errors.modelNotReady(`no version of model "${model}" is ready`);
      return ready;
    }
    const found = versions.find((v) => v.name.endsWith(`/versions/${versionId}`));
    if (found === undefined) throw Errors.versionNotFound(`model "${model}" has no version ${versionId}`);
    return found;
  }

  /** Takes every traffic report (traffic-reporter.spec.ts tests them against a registry server). */
  async reportTraffic(): Promise<void> {}

  /** The model, its versions and rollout policy; recorded as a lookup without a version id. */
  async getModel(model: string): Promise<Model> {
    this.calls.push({ model, versionId: '' });
    const versions = MODELS[model];
    if (versions === undefined) throw Errors.modelNotFound(`model "${model}" not found`);
    return create(ModelSchema, {
      name: `models/${model}`,
      versions,
      ...(ROLLOUTS[model] !== undefined && { rollout: ROLLOUTS[model] }),
      ...(CACHES[model] !== undefined && { cache: CACHES[model] }),
    });
  }
}

/** An in-memory result cache; `failWith` makes every call fail. */
class FakeCache {
  readonly entries = new Map<string, InferenceResponse>();
  readonly lookups: { key: string; timeoutMs: number }[] = [];
  readonly stores: { key: string; response: InferenceResponse; ttlMs: number }[] = [];
  failWith: Error | undefined;
  /** Keys the cache says it certainly does not hold (hex); none unless a test says. */
  readonly absent = new Set<string>();

  get knowsKeys(): boolean {
    return this.absent.size > 0;
  }

  certainlyAbsent(key: Uint8Array): boolean {
    return this.absent.has(hex(key));
  }

  async lookup(key: Uint8Array, timeoutMs: number): Promise<InferenceResponse | undefined> {
    this.lookups.push({ key: hex(key), timeoutMs });
    if (this.failWith) throw this.failWith;
    return this.entries.get(hex(key));
  }

  async store(key: Uint8Array, response: InferenceResponse, ttlMs: number): Promise<boolean> {
    this.stores.push({ key: hex(key), response, ttlMs });
    if (this.failWith) throw this.failWith;
    this.entries.set(hex(key), response);
    return true;
  }
}

/** Runs requests the way a worker does: the requested outputs, stamped with the request's version and id. */
class FakeBatcher {
  readonly requests: InferenceRequest[] = [];
  /** Errors the next calls throw, one each, before answering again. */
  readonly failures: RpcError[] = [];
  /** A version whose every call fails UNAVAILABLE. */
  failingVersion: string | undefined;
  /** While set, calls wait for it before answering. */
  hold: Promise<void> | undefined;

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    this.requests.push(request);
    if (this.hold !== undefined) await this.hold;
    if (request.modelVersion === this.failingVersion)
      throw Errors.upstreamUnavailable(`version ${request.modelVersion} is down`);
    const failure = this.failures.shift();
    if (failure !== undefined) throw failure;
    const names = request.outputNames.length > 0 ? request.outputNames : signature.outputs.map((o) => o.name);
    return create(InferenceResponseSchema, {
      modelName: request.modelName,
      modelVersion: request.modelVersion,
      id: request.id,
      outputs: names.map((name) => ({ name, datatype: DataType.FP32, shape: [1n], data: new Uint8Array(4) })),
    });
  }
}

const hex = (key: Uint8Array) => Buffer.from(key).toString('hex');

/** A valid request for mlp: one row of x. */
const inferRequest = (init: MessageInitShape<typeof InferenceRequestSchema> = {}): InferenceRequest =>
  create(InferenceRequestSchema, {
    modelName: 'mlp',
    id: 'req-1',
    inputs: [{ name: 'x', datatype: DataType.FP32, shape: [1n, 4n], data: new Uint8Array(16) }],
    ...init,
  });

/** The router module as main.ts builds it, with the given providers replaced. */
function overridden(module: DynamicModule, replacements: Map<Type | Abstract<unknown>, object>): DynamicModule {
  return {
    ...module,
    providers: [
      ...(module.providers ?? []).filter((p) => !replacements.has(p as Type)),
      ...[...replacements].map(([provide, useValue]) => ({ provide, useValue })),
    ],
  };
}

interface Harness {
  sut: InferenceRouter;
  app: INestApplicationContext;
  registry: FakeRegistry;
  cache: FakeCache;
  batcher: FakeBatcher;
}

const running: INestApplicationContext[] = [];

/**
 * Starts the router's Nest context; `keep` names the adapters left real (pointed at real addresses in
 * env); its time is `clock` when given, else the system's.
 */
async function startRouter(env: Record<string, string> = {}, keep: Type[] = [], clock?: Clock): Promise<Harness> {
  const registry = new FakeRegistry();
  const cache = new FakeCache();
  const batcher = new FakeBatcher();
  const replacements = new Map<Type | Abstract<unknown>, object>([
    [RegistryAdapter, registry],
    [CacheAdapter, cache],
    [BatcherAdapter, batcher],
  ]);
  for (const k of keep) replacements.delete(k);
  if (clock !== undefined) replacements.set(Clock, clock);
  // The registry watch finds no registry there: the router asks the fake registry above instead
  // (version-resolver.spec.ts tests the router following the watch).
  const config = loadRouterConfig({
    ROUTER_LOG_LEVEL: 'error',
    ROUTER_REGISTRY_ADDRESS: `127.0.0.1:${await freePort()}`,
    ...env,
  });
  const app = await NestFactory.createApplicationContext(overridden(RouterModule.forRoot(config), replacements), {
    logger: false,
    abortOnError: false,
  });
  running.push(app);
  return { sut: app.get(InferenceRouter), app, registry, cache, batcher };
}

async function counter(app: INestApplicationContext, name: string, labels: Record<string, string>): Promise<number> {
  const metric = app.get(Metrics).registry.getSingleMetric(`infermesh_router_${name}`);
  if (metric === undefined) throw new Error(`no metric ${name}`);
  const { values } = await metric.get();
  const found = values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l));
  return found?.value ?? 0;
}

afterEach(async () => {
  for (const app of running.splice(0)) await app.close();
});

describe(InferenceRouter.name, () => {
  describe('version resolution', () => {
    it('serves the latest READY version and stamps it on the request to the batcher and on the response', async () => {
      const { sut, registry, batcher } = await startRouter();

      const response = await sut.infer(inferRequest());

      expect(registry.calls).toEqual([{ model: 'mlp', versionId: '' }]);
      expect(batcher.requests).toHaveLength(1);
      expect(batcher.requests[0]).toMatchObject({ modelName: 'mlp', modelVersion: '2', id: 'req-1' });
      expect(response).toMatchObject({ modelName: 'mlp', modelVersion: '2', id: 'req-1', cached: false });
    });

    it('passes an explicit version through', async () => {
      const { sut, registry, batcher } = await startRouter();

      const response = await sut.infer(inferRequest({ modelVersion: '1' }));

      // The version is resolved by the registry; the model is read too, for its cache policy.
      expect(registry.calls).toEqual([
        { model: 'mlp', versionId: '1' },
        { model: 'mlp', versionId: '' },
      ]);
      expect(batcher.requests[0]!.modelVersion).toBe('1');
      expect(response.modelVersion).toBe('1');
    });

    it('refuses an explicit version that is not READY with UNAVAILABLE MODEL_NOT_READY', async () => {
      const { sut, batcher } = await startRouter();

      const error = await rpcRejection(sut.infer(inferRequest({ modelVersion: '3' })));

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(batcher.requests).toHaveLength(0);
    });

    it.each([
      // An unknown name is the caller's free text: it is counted under "(unknown)", never as a label value of its own.
      ['an unknown model', 'missing', '', status.NOT_FOUND, 'MODEL_NOT_FOUND', '(unknown)'],
      ['an unknown version', 'mlp', '9', status.NOT_FOUND, 'VERSION_NOT_FOUND', 'mlp'],
      ['a model with no READY version', 'cold', '', status.UNAVAILABLE, 'MODEL_NOT_READY', 'cold'],
    ])(
      'passes the registry error for %s through with its code and reason',
      async (_case, modelName, modelVersion, code, reason, label) => {
        const { sut, batcher, app } = await startRouter();

        const error = await rpcRejection(sut.infer(inferRequest({ modelName, modelVersion })));

        expect([error.code, error.reason]).toEqual([code, reason]);
        expect(error.message).toContain(modelName);
        expect(batcher.requests).toHaveLength(0);
        expect(await counter(app, 'requests_total', { model: label, outcome: String(code) })).toBe(1);
      },
    );

    it('answers UNAVAILABLE when the registry cannot be reached', async () => {
      const { sut, batcher } = await startRouter({ ROUTER_REGISTRY_ADDRESS: `127.0.0.1:${await freePort()}` }, [
        RegistryAdapter,
      ]);

      const error = await rpcRejection(sut.infer(inferRequest()));

      expect(error.code).toBe(status.UNAVAILABLE);
      expect(batcher.requests).toHaveLength(0);
    });

    it('refuses a request that names no model with INVALID_ARGUMENT without asking the registry', async () => {
      const { sut, registry, batcher } = await startRouter();

      const error = await rpcRejection(sut.infer(inferRequest({ modelName: '' })));

      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(registry.calls).toHaveLength(0);
      expect(batcher.requests).toHaveLength(0);
    });
  });

  describe('rollout', () => {
    it('keeps each routing key on the version the rollout gives it, and counts how each request was routed', async () => {
      const { sut, app } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });
      const versionsOf = async () => {
        const served: string[] = [];
        for (let k = 0; k < 40; k++)
          served.push((await sut.infer(inferRequest({ modelName: 'ab', routingKey: `user-${k}` }))).modelVersion);
        return served;
      };

      const first = await versionsOf();
      expect(await versionsOf()).toEqual(first);
      expect(new Set(first)).toEqual(new Set(['1', '2']));
      const onTwo = first.filter((v) => v === '2').length;
      expect(await counter(app, 'routed_total', { model: 'ab', version: '2', route: 'variant' })).toBe(2 * onTwo);
      expect(await counter(app, 'routed_total', { model: 'ab', version: '1', route: 'stable' })).toBe(2 * (40 - onTwo));
      // A request naming its version is served that version whatever its key.
      await sut.infer(inferRequest({ modelName: 'ab', modelVersion: '2', routingKey: 'user-0' }));
      expect(await counter(app, 'routed_total', { model: 'ab', version: '2', route: 'explicit' })).toBe(1);
    });

    it('times each successful request under the version that served it', async () => {
      const { sut, app } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });

      await sut.infer(inferRequest({ modelVersion: '1' }));
      await sut.infer(inferRequest({ modelVersion: '2' }));
      await sut.infer(inferRequest({ modelVersion: '2' }));
      await rpcRejection(sut.infer(inferRequest({ modelVersion: '3' })));

      const text = await app.get(Metrics).render();
      expect(text).toContain(
        'infermesh_router_request_duration_seconds_count{model="mlp",version="1",cached="false"} 1\n',
      );
      expect(text).toContain(
        'infermesh_router_request_duration_seconds_count{model="mlp",version="2",cached="false"} 2\n',
      );
      expect(text).not.toContain('infermesh_router_request_duration_seconds_count{model="mlp",version="3"');
    });
  });

  describe('fallback', () => {
    it('answers with the fallback model, marked degraded, when the model has no READY version', async () => {
      const { sut, batcher, app } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });

      const response = await sut.infer(inferRequest({ modelName: 'frozen' }));

      expect(response).toMatchObject({ modelName: 'mlp', modelVersion: '2', degraded: true, id: 'req-1' });
      expect(batcher.requests.map((r) => r.modelName)).toEqual(['mlp']);
      expect(
        await counter(app, 'fallbacks_total', { model: 'frozen', fallback: 'mlp', reason: 'MODEL_NOT_READY' }),
      ).toBe(1);
    });

    it('answers with the fallback when the queue is full or the circuit is open, never for an invalid request', async () => {
      const { sut, batcher, app } = await startRouter({
        ROUTER_CACHE_ENABLED: 'false',
        ROUTER_RETRY_ATTEMPTS: '0',
        ROUTER_BREAKER_FAILURES: '1',
      });
      batcher.failures.push(Errors.queueFull('the queue is full'));
      await expect(sut.infer(inferRequest({ modelName: 'ab', routingKey: 'k' }))).resolves.toMatchObject({
        modelName: 'mlp',
        degraded: true,
      });

      // Version 1 of ab fails: its first failure opens its circuit; its keys go to the fallback, version 2's are served.
      batcher.failingVersion = '1';
      for (let k = 0; k < 20; k++) {
        const routingKey = `k${k}`;
        const onTwo = stickyBucket('models/ab', routingKey) < 50;
        const response = await sut.infer(inferRequest({ modelName: 'ab', routingKey }));
        expect(response).toMatchObject(
          onTwo ? { modelName: 'ab', modelVersion: '2', degraded: false } : { modelName: 'mlp', degraded: true },
        );
      }
      expect(
        await counter(app, 'fallbacks_total', { model: 'ab', fallback: 'mlp', reason: 'CIRCUIT_OPEN' }),
      ).toBeGreaterThan(0);

      const invalid = await rpcRejection(sut.infer(inferRequest({ modelName: 'ab', inputs: [] })));
      expect(invalid.code).toBe(status.INVALID_ARGUMENT);
    });

    it('does not fall back for a request that names its version', async () => {
      const { sut } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });

      const error = await rpcRejection(sut.infer(inferRequest({ modelName: 'frozen', modelVersion: '1' })));

      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
    });
  });

  describe('shadow traffic', () => {
    const shadowLabels = { model: 'sh', primary: '1', shadow: '2' };

    it('mirrors a request to the shadow version after answering it, and counts how the outputs agree', async () => {
      const { sut, batcher, app } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });

      const response = await sut.infer(inferRequest({ modelName: 'sh' }));

      expect(response.modelVersion).toBe('1');
      await eventually(
        async () => (await counter(app, 'shadow_requests_total', { ...shadowLabels, outcome: 'ok' })) === 1,
      );
      expect(batcher.requests.map((r) => r.modelVersion)).toEqual(['1', '2']);
      // Both versions answer the same zeros: two outputs of shape [1], each compared whole, both agreeing.
      expect(await counter(app, 'shadow_compared_items_total', shadowLabels)).toBe(2);
      expect(await counter(app, 'shadow_agreed_items_total', shadowLabels)).toBe(2);
    });

    it('never fails or delays the answer when the shadow fails', async () => {
      const { sut, batcher, app } = await startRouter({
        ROUTER_CACHE_ENABLED: 'false',
        ROUTER_RETRY_BASE_MS: '1',
        ROUTER_RETRY_MAX_MS: '1',
      });
      batcher.failingVersion = '2';

      await expect(sut.infer(inferRequest({ modelName: 'sh' }))).resolves.toMatchObject({ modelVersion: '1' });

      await eventually(
        async () =>
          (await counter(app, 'shadow_requests_total', { ...shadowLabels, outcome: String(status.UNAVAILABLE) })) === 1,
      );
      expect(
        await counter(app, 'shadow_requests_total', { ...shadowLabels, outcome: String(status.UNAVAILABLE) }),
      ).toBe(1);
      expect(await counter(app, 'shadow_compared_items_total', shadowLabels)).toBe(0);
    });
  });

  describe('signature checks', () => {
    it.each([
      ['a wrong shape', [{ name: 'x', datatype: DataType.FP32, shape: [1n, 3n], data: new Uint8Array(12) }], 'x'],
      ['a wrong datatype', [{ name: 'x', datatype: DataType.INT32, shape: [1n, 4n], data: new Uint8Array(16) }], 'x'],
      ['too little data', [{ name: 'x', datatype: DataType.FP32, shape: [1n, 4n], data: new Uint8Array(8) }], 'x'],
      [
        'a batch above the maximum',
        [{ name: 'x', datatype: DataType.FP32, shape: [9n, 4n], data: new Uint8Array(144) }],
        'x',
      ],
      ['a missing input', [], 'x'],
      [
        'an unknown input',
        [
          { name: 'x', datatype: DataType.FP32, shape: [1n, 4n], data: new Uint8Array(16) },
          { name: 'w', datatype: DataType.FP32, shape: [1n], data: new Uint8Array(4) },
        ],
        'w',
      ],
    ])(
      'refuses %s with INVALID_ARGUMENT naming the tensor, without reaching the batcher',
      async (_case, inputs, tensor) => {
        const { sut, batcher, cache } = await startRouter();

        const error = await rpcRejection(sut.infer(inferRequest({ inputs })));

        expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
        expect(error.message).toContain(`"${tensor}"`);
        expect(batcher.requests).toHaveLength(0);
        expect(cache.lookups).toHaveLength(0);
      },
    );

    it('refuses an unknown requested output with INVALID_ARGUMENT naming it', async () => {
      const { sut, batcher } = await startRouter();

      const error = await rpcRejection(sut.infer(inferRequest({ outputNames: ['y', 'nope'] })));

      expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
      expect(error.message).toContain('"nope"');
      expect(batcher.requests).toHaveLength(0);
    });

    it('serves only the requested outputs', async () => {
      const { sut, batcher } = await startRouter();

      const response = await sut.infer(inferRequest({ outputNames: ['z'] }));

      expect(batcher.requests[0]!.outputNames).toEqual(['z']);
      expect(response.outputs.map((o) => o.name)).toEqual(['z']);
    });
  });

  describe('result cache', () => {
    it('on a miss runs the request on the batcher and stores the result under the key it looked up', async () => {
      const { sut, cache, batcher, app } = await startRouter({ ROUTER_CACHE_TIMEOUT_MS: '75' });

      const response = await sut.infer(inferRequest());

      const key = hex(cacheKey(inferRequest({ modelVersion: '2' }), 'sha256-of-mlp-2'));
      expect(cache.lookups).toEqual([{ key, timeoutMs: 75 }]);
      expect(batcher.requests).toHaveLength(1);
      expect(cache.stores).toHaveLength(1);
      expect(cache.stores[0]!.key).toBe(key);
      expect(cache.stores[0]!.response).toMatchObject({ modelVersion: '2', outputs: response.outputs });
      expect(await counter(app, 'cache_requests_total', { outcome: 'miss' })).toBe(1);
    });

    it('does not ask the cache about a key it says it certainly does not hold, and stores the answer as after any miss', async () => {
      const { sut, cache, batcher, app } = await startRouter();
      const key = hex(cacheKey(inferRequest({ modelVersion: '2' }), 'sha256-of-mlp-2'));
      cache.absent.add(key);

      const response = await sut.infer(inferRequest());

      expect(response).toMatchObject({ modelVersion: '2', cached: false });
      expect(cache.lookups).toHaveLength(0);
      expect(batcher.requests).toHaveLength(1);
      expect(cache.stores.map((s) => s.key)).toEqual([key]);
      expect(await counter(app, 'cache_requests_total', { outcome: 'miss' })).toBe(1);
      expect(await counter(app, 'cache_lookups_skipped_total', {})).toBe(1);
      // Any other key is asked about.
      await sut.infer(
        inferRequest({
          inputs: [{ name: 'x', datatype: DataType.FP32, shape: [1n, 4n], data: new Uint8Array(16).fill(1) }],
        }),
      );
      expect(cache.lookups).toHaveLength(1);
      expect(await counter(app, 'cache_lookups_skipped_total', {})).toBe(1);
    });

    it('on a hit answers without the batcher, marked cached, with the request’s own id: from the shared cache, then from its own', async () => {
      const { sut, batcher, cache, app } = await startRouter();
      const first = await sut.infer(inferRequest({ id: 'first' }));

      const second = await sut.infer(inferRequest({ id: 'second' }));
      const third = await sut.infer(inferRequest({ id: 'third' }));

      expect(batcher.requests).toHaveLength(1);
      for (const [answer, id] of [
        [second, 'second'],
        [third, 'third'],
      ] as const) {
        expect(answer).toMatchObject({ id, cached: true, modelName: 'mlp', modelVersion: '2' });
        expect(answer.outputs).toEqual(first.outputs);
      }
      expect(await counter(app, 'cache_requests_total', { outcome: 'hit' })).toBe(1);
      expect(await counter(app, 'cache_requests_total', { outcome: 'local_hit' })).toBe(1);
      expect(cache.lookups).toHaveLength(2);
    });

    it('keeps in its own cache what it computed only while the shared cache cannot be asked', async () => {
      const { sut, batcher, cache, app } = await startRouter();
      await sut.infer(inferRequest({ id: 'computed' }));
      cache.entries.clear();

      await sut.infer(inferRequest({ id: 'again' }));
      expect(batcher.requests).toHaveLength(2);

      cache.failWith = Errors.upstreamUnavailable('the cache is down');
      const data = new Uint8Array(16).fill(9);
      const other = { inputs: [{ name: 'x', datatype: DataType.FP32, shape: [1n, 4n], data }] };
      await sut.infer(inferRequest({ id: 'bypassed', ...other }));
      const repeated = await sut.infer(inferRequest({ id: 'repeated', ...other }));

      expect(batcher.requests).toHaveLength(3);
      expect(repeated).toMatchObject({ id: 'repeated', cached: true });
      expect(await counter(app, 'cache_requests_total', { outcome: 'bypass' })).toBe(1);
      expect(await counter(app, 'cache_requests_total', { outcome: 'local_hit' })).toBe(1);
      expect(cache.stores).toHaveLength(2);
    });

    it('on a hit in the shared cache (an answer another router stored) answers from it, then from its own cache', async () => {
      const { sut, batcher, cache, app } = await startRouter();
      const key = hex(cacheKey(inferRequest({ modelVersion: '2' }), 'sha256-of-mlp-2'));
      cache.entries.set(
        key,
        create(InferenceResponseSchema, {
          modelName: 'mlp',
          modelVersion: '2',
          id: 'elsewhere',
          outputs: [{ name: 'y', data: new Uint8Array(8) }],
        }),
      );

      const first = await sut.infer(inferRequest({ id: 'a' }));
      const second = await sut.infer(inferRequest({ id: 'b' }));

      expect(batcher.requests).toHaveLength(0);
      expect([first, second].map((r) => [r.id, r.cached, r.outputs[0]!.name])).toEqual([
        ['a', true, 'y'],
        ['b', true, 'y'],
      ]);
      expect(await counter(app, 'cache_requests_total', { outcome: 'hit' })).toBe(1);
      expect(await counter(app, 'cache_requests_total', { outcome: 'local_hit' })).toBe(1);
    });

    it('does not serve one version’s cached result for another version', async () => {
      const { sut, batcher } = await startRouter();
      await sut.infer(inferRequest());

      const response = await sut.infer(inferRequest({ modelVersion: '1' }));

      expect(response).toMatchObject({ modelVersion: '1', cached: false });
      expect(batcher.requests.map((r) => r.modelVersion)).toEqual(['2', '1']);
    });

    it('bypasses a failing cache: the request succeeds through the batcher and counts as bypass', async () => {
      const { sut, cache, batcher, app } = await startRouter();
      cache.failWith = Errors.upstreamUnavailable('cache down');

      const response = await sut.infer(inferRequest());

      expect(response).toMatchObject({ modelVersion: '2', cached: false });
      expect(batcher.requests).toHaveLength(1);
      expect(cache.stores).toHaveLength(0);
      expect(await counter(app, 'cache_requests_total', { outcome: 'bypass' })).toBe(1);
      expect(await counter(app, 'cache_requests_total', { outcome: 'miss' })).toBe(0);
    });

    it('bypasses a slow cache after ROUTER_CACHE_TIMEOUT_MS and counts it as bypass', async () => {
      // A real gRPC cache service, reached through the real CacheAdapter, whose lookups answer only
      // once the router has given up on them: the router's own deadline on a real call is under test.
      let lookupsAbandoned = 0;
      const slowCache: Omit<ServiceImpl<typeof CacheService>, 'lookups' | 'stores'> = {
        async lookup(_request, ctx) {
          await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
          lookupsAbandoned += 1;
          return { found: false };
        },
        async store() {
          return { stored: true };
        },
        watchKeys: unlistedKeys,
      };
      const server = new GrpcServer({
        logger: new JsonLogger('fake-cache', 'error'),
        metrics: new Metrics('fake_cache'),
        maxMessageBytes: 1 << 20,
      });
      server.add(CacheService, slowCache, { lookups: 'lookup', stores: 'store' });
      const port = await server.listen('127.0.0.1', 0);
      try {
        const { sut, batcher, app } = await startRouter(
          { ROUTER_CACHE_ADDRESS: `127.0.0.1:${port}`, ROUTER_CACHE_TIMEOUT_MS: '100' },
          [CacheAdapter],
        );

        const response = await sut.infer(inferRequest());

        expect(response).toMatchObject({ modelVersion: '2', cached: false });
        await eventually(() => lookupsAbandoned === 1);
        expect(batcher.requests).toHaveLength(1);
        expect(await counter(app, 'cache_requests_total', { outcome: 'bypass' })).toBe(1);
      } finally {
        await server.shutdown(10);
      }
    });

    it('answers even when storing the result fails', async () => {
      const { sut, cache } = await startRouter();
      cache.store = async () => {
        throw Errors.upstreamUnavailable('cache down');
      };

      await expect(sut.infer(inferRequest())).resolves.toMatchObject({ modelVersion: '2', cached: false });
    });

    it('never answers one tenant from the entry of another, unless ROUTER_CACHE_PER_TENANT=false shares entries', async () => {
      const { sut, batcher } = await startRouter();
      await sut.infer(inferRequest({ tenant: 'key:a' }));
      await expect(sut.infer(inferRequest({ tenant: 'key:b' }))).resolves.toMatchObject({ cached: false });
      await expect(sut.infer(inferRequest({ tenant: 'key:a' }))).resolves.toMatchObject({ cached: true });
      expect(batcher.requests).toHaveLength(2);

      const shared = await startRouter({ ROUTER_CACHE_PER_TENANT: 'false' });
      await shared.sut.infer(inferRequest({ tenant: 'key:a' }));
      await expect(shared.sut.infer(inferRequest({ tenant: 'key:b' }))).resolves.toMatchObject({ cached: true });
    });

    it('follows the model cache policy: off, its own time to live, and no entry over its size limit', async () => {
      const { sut, batcher, cache, app } = await startRouter();

      await sut.infer(inferRequest({ modelName: 'uncached' }));
      await sut.infer(inferRequest({ modelName: 'uncached', modelVersion: '1' }));
      expect(cache.lookups).toHaveLength(0);
      expect(await counter(app, 'cache_requests_total', { outcome: 'disabled' })).toBe(2);

      // Answers of 2 outputs x 4 bytes are over the 4-byte limit: never stored, run every time.
      await sut.infer(inferRequest({ modelName: 'small' }));
      await sut.infer(inferRequest({ modelName: 'small' }));
      expect(cache.stores).toHaveLength(0);
      expect(batcher.requests.filter((r) => r.modelName === 'small')).toHaveLength(2);

      // One output of 4 bytes fits, and is stored for the model's 5 s.
      await sut.infer(inferRequest({ modelName: 'small', outputNames: ['y'] }));
      await expect(sut.infer(inferRequest({ modelName: 'small', outputNames: ['y'] }))).resolves.toMatchObject({
        cached: true,
      });
      expect(cache.stores.map((st) => st.ttlMs)).toEqual([5_000]);
    });

    it('runs identical requests that miss together once, each answered with its own id', async () => {
      const { sut, batcher, cache, app } = await startRouter();
      let release!: () => void;
      batcher.hold = new Promise((r) => (release = r));

      const answers = Promise.all(['a', 'b', 'c'].map((id) => sut.infer(inferRequest({ id }))));
      // b and c have joined a's inference, which waits in the batcher.
      await eventually(async () => (await counter(app, 'cache_requests_total', { outcome: 'coalesced' })) === 2);
      expect(batcher.requests).toHaveLength(1);
      release();
      const responses = await answers;

      expect(batcher.requests).toHaveLength(1);
      expect(responses.map((r) => r.id)).toEqual(['a', 'b', 'c']);
      expect(responses.every((r) => r.outputs.length === 2 && !r.cached)).toBe(true);
      expect(await counter(app, 'cache_requests_total', { outcome: 'coalesced' })).toBe(2);
      expect(cache.stores).toHaveLength(1);
      // A different request is not joined to it.
      await sut.infer(inferRequest({ id: 'd', outputNames: ['y'] }));
      expect(batcher.requests).toHaveLength(2);
    });

    it('with ROUTER_CACHE_ENABLED=false never touches the cache', async () => {
      const { sut, cache, batcher, app } = await startRouter({ ROUTER_CACHE_ENABLED: 'false' });

      await sut.infer(inferRequest({ id: 'a' }));
      const second = await sut.infer(inferRequest({ id: 'b' }));

      expect(cache.lookups).toHaveLength(0);
      expect(cache.stores).toHaveLength(0);
      expect(batcher.requests).toHaveLength(2);
      expect(second).toMatchObject({ id: 'b', cached: false });
      expect(await counter(app, 'cache_requests_total', { outcome: 'disabled' })).toBe(2);
    });
  });

  describe('batcher failures', () => {
    const unavailable = () => Errors.modelNotReady('no worker has model "mlp" version 2 ready');
    // No cache on these paths: every request reaches the batcher.
    const env = { ROUTER_CACHE_ENABLED: 'false', ROUTER_RETRY_BASE_MS: '5', ROUTER_RETRY_MAX_MS: '20' };

    it('retries an UNAVAILABLE answer with backoff, up to ROUTER_RETRY_ATTEMPTS times', async () => {
      const { sut, batcher, app } = await startRouter(env);
      batcher.failures.push(unavailable(), unavailable());

      await expect(sut.infer(inferRequest())).resolves.toMatchObject({ modelVersion: '2' });
      expect(batcher.requests).toHaveLength(3);
      expect(await counter(app, 'batcher_retries_total', { model: 'mlp' })).toBe(2);

      batcher.failures.push(unavailable(), unavailable(), unavailable());
      const error = await rpcRejection(sut.infer(inferRequest()));
      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
      expect(batcher.requests).toHaveLength(6);
    });

    it('does not retry other errors, a full queue included', async () => {
      const { sut, batcher } = await startRouter(env);
      batcher.failures.push(Errors.queueFull('the queue is full', { retryDelayMs: 100 }));

      const error = await rpcRejection(sut.infer(inferRequest()));

      expect([error.code, error.reason, error.retryDelayMs]).toEqual([status.RESOURCE_EXHAUSTED, 'QUEUE_FULL', 100]);
      expect(batcher.requests).toHaveLength(1);
    });

    it('does not retry past the request deadline', async () => {
      const clock = new ManualClock();
      const { sut, batcher } = await startRouter(
        { ...env, ROUTER_RETRY_BASE_MS: '1000', ROUTER_RETRY_MAX_MS: '1000' },
        [],
        clock,
      );
      batcher.failures.push(unavailable(), unavailable());

      // The jittered wait draws 500 ms, with 30 ms left: the error goes back at once instead (the
      // clock does not move: a wait for the retry would never end).
      const random = jest.spyOn(Math, 'random').mockReturnValue(0.5);
      try {
        const error = await rpcRejection(
          requestContext.run({ requestId: 'r', deadlineMs: clock.now() + 30 }, () => sut.infer(inferRequest())),
        );

        expect(clock.pendingInMs()).not.toContain(500); // no retry waiting
        expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
        expect(batcher.requests).toHaveLength(1);
      } finally {
        random.mockRestore();
      }
    });

    it('opens the circuit of a version after ROUTER_BREAKER_FAILURES consecutive failures, then probes it after the cool-down', async () => {
      const clock = new ManualClock();
      const { sut, batcher, app } = await startRouter(
        {
          ...env,
          ROUTER_RETRY_ATTEMPTS: '0',
          ROUTER_BREAKER_FAILURES: '3',
          ROUTER_BREAKER_COOLDOWN_MS: '300',
        },
        [],
        clock,
      );
      batcher.failures.push(unavailable(), unavailable(), unavailable());
      for (let i = 0; i < 3; i++) await rpcRejection(sut.infer(inferRequest()));

      const open = await rpcRejection(sut.infer(inferRequest()));
      expect([open.code, open.reason]).toEqual([status.UNAVAILABLE, 'CIRCUIT_OPEN']);
      expect(open.message).toContain('model "mlp" version 2');
      expect(open.retryDelayMs).toBe(300);
      expect(batcher.requests).toHaveLength(3);
      expect(await counter(app, 'circuit_state', { model: 'mlp', version: '2' })).toBe(2);
      // Another version of the model has a circuit of its own.
      await expect(sut.infer(inferRequest({ modelVersion: '1' }))).resolves.toMatchObject({ modelVersion: '1' });

      clock.advance(299);
      expect((await rpcRejection(sut.infer(inferRequest()))).reason).toBe('CIRCUIT_OPEN');
      clock.advance(1);
      await expect(sut.infer(inferRequest())).resolves.toMatchObject({ modelVersion: '2' });
      expect(await counter(app, 'circuit_state', { model: 'mlp', version: '2' })).toBe(0);
      expect(await counter(app, 'circuit_transitions_total', { model: 'mlp', version: '2', state: 'open' })).toBe(1);
      expect(await counter(app, 'circuit_transitions_total', { model: 'mlp', version: '2', state: 'closed' })).toBe(1);
    });

    it.each<[string, RpcError, number | undefined]>([
      ['a refusal of bad input', Errors.invalidTensor('bad tensor'), undefined],
      ['a full queue', Errors.queueFull('the queue is full'), undefined],
      ['a cancelled call', new RpcError(status.CANCELLED, 'the call was cancelled'), undefined],
      ['a deadline the queue could not meet', Errors.deadlineInfeasible('cannot be met'), 5_000],
      ['a timeout of a caller that gave 5 ms', new RpcError(status.DEADLINE_EXCEEDED, 'deadline exceeded'), 5],
      [
        'a timeout of a caller that gave 500 ms (under ROUTER_BREAKER_TIMEOUT_MIN_BUDGET_MS)',
        new RpcError(status.DEADLINE_EXCEEDED, 'deadline exceeded'),
        500,
      ],
    ])('never opens the circuit for what the caller caused: %s', async (_case, error, budgetMs) => {
      const { sut, batcher, app } = await startRouter({
        ...env,
        ROUTER_RETRY_ATTEMPTS: '0',
        ROUTER_BREAKER_FAILURES: '2',
      });
      await sut.infer(inferRequest({ id: 'warm' })); // an observed latency for the version
      for (let i = 0; i < 5; i++) batcher.failures.push(error);
      const call = () =>
        budgetMs === undefined
          ? sut.infer(inferRequest())
          : requestContext.run({ requestId: 'r', deadlineMs: Date.now() + budgetMs }, () => sut.infer(inferRequest()));

      for (let i = 0; i < 5; i++) expect((await rpcRejection(call())).code).toBe(error.code);

      await expect(sut.infer(inferRequest())).resolves.toMatchObject({ modelVersion: '2' });
      expect(await counter(app, 'circuit_transitions_total', { model: 'mlp', version: '2', state: 'open' })).toBe(0);
      expect(
        await counter(app, 'circuit_not_counted_total', { model: 'mlp', version: '2', code: status[error.code] }),
      ).toBe(5);
    });

    it('counts a timeout against the version when the caller gave it far more than the version needs', async () => {
      const { sut, batcher } = await startRouter({ ...env, ROUTER_RETRY_ATTEMPTS: '0', ROUTER_BREAKER_FAILURES: '2' });
      await sut.infer(inferRequest({ id: 'warm' }));
      batcher.failures.push(
        new RpcError(status.DEADLINE_EXCEEDED, 'deadline exceeded'),
        new RpcError(status.DEADLINE_EXCEEDED, 'deadline exceeded'),
      );
      const generous = () =>
        requestContext.run({ requestId: 'r', deadlineMs: Date.now() + 10_000 }, () => sut.infer(inferRequest()));
      for (let i = 0; i < 2; i++) await rpcRejection(generous());

      const open = await rpcRejection(sut.infer(inferRequest()));
      expect([open.code, open.reason]).toEqual([status.UNAVAILABLE, 'CIRCUIT_OPEN']);
    });

    it('does not let refusals of bad input hide a failing version: they neither count nor reset its failures', async () => {
      const { sut, batcher } = await startRouter({ ...env, ROUTER_RETRY_ATTEMPTS: '0', ROUTER_BREAKER_FAILURES: '2' });
      batcher.failures.push(unavailable(), Errors.invalidTensor('bad tensor'), unavailable());
      for (let i = 0; i < 3; i++) await rpcRejection(sut.infer(inferRequest()));

      const open = await rpcRejection(sut.infer(inferRequest()));
      expect([open.code, open.reason]).toEqual([status.UNAVAILABLE, 'CIRCUIT_OPEN']);
    });
  });
});
