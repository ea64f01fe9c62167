import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RateLimitSchema, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { type Bucket, type Decision, MemoryRateLimiter } from '@infermesh/rate-limit';
import type { RunningService } from '@infermesh/runtime';
import { Metrics } from '@infermesh/telemetry';
import { ManualClock, type RedisServer, rpcRejection, startRedisServer } from '@infermesh/testing';
import type { Principal } from './api-keys/api-keys';
import { GatewayMetrics } from '../gateway-metrics';
import { bucketsOf, RateLimits } from './rate-limits';
import {
  type FakeUpstreams,
  metricsOf,
  postJson,
  type Reply,
  startFakeUpstreams,
  startTestGateway,
} from '../testing/gateway-harness';

const ADMIN_KEY = 'limits-spec-admin-key-0123456789';
const OTHER_KEY = 'limits-spec-other-key-0123456789';
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const INPUT = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
const grpcInfer = (modelName: string) =>
  create(ModelInferRequestSchema, {
    modelName,
    inputs: [{ name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
  });

const infer = (gateway: RunningService, key: string, model = 'mlp') =>
  postJson(gateway.httpPort!, `/v2/models/${model}/infer`, { inputs: [INPUT] }, bearer(key));

/** The statuses of `count` inference requests in a row. */
async function statuses(
  gateway: RunningService | (() => RunningService),
  key: string,
  count: number,
  model = 'mlp',
): Promise<number[]> {
  const codes: number[] = [];
  for (let i = 0; i < count; i++)
    codes.push((await infer(typeof gateway === 'function' ? gateway() : gateway, key, model)).status);
  return codes;
}

/** Creates a stored key through the gateway's REST admin API; its secret and id. */
async function createKey(
  gateway: RunningService,
  init: Record<string, unknown>,
): Promise<{ secret: string; id: string }> {
  const reply = await postJson(
    gateway.httpPort!,
    '/admin/v1/api-keys',
    { scopes: ['SCOPE_INFER'], ...init },
    bearer(ADMIN_KEY),
  );
  expect(reply.status).toBe(200);
  const { key, secret } = reply.json as { key: { name: string }; secret: string };
  return { secret, id: key.name.slice('apiKeys/'.length) };
}

/** The value of a counter sample, 0 when absent. */
const sample = (metrics: string, series: string) =>
  Number(new RegExp(`^${series.replace(/[{}()[\].+*?^$|\\]/g, '\\$&')} (\\S+)$`, 'm').exec(metrics)?.[1] ?? 0);

let upstreams: FakeUpstreams;

beforeAll(async () => {
  upstreams = await startFakeUpstreams();
});

afterAll(async () => {
  await upstreams?.stop();
});

const start = (env: Record<string, string> = {}) =>
  startTestGateway(upstreams.router.address, upstreams.registry.address, {
    GATEWAY_API_KEYS: `${ADMIN_KEY}, ${OTHER_KEY}`,
    ...env,
  });

describe(bucketsOf.name, () => {
  it('draws from no bucket without rates, from a key bucket and a bucket per model with them', () => {
    expect(bucketsOf(undefined, 'mlp')).toEqual([]);
    expect(bucketsOf(create(RateLimitSchema, { burst: 5, perModelBurst: 5 }), 'mlp')).toEqual([]);
    expect(
      bucketsOf(
        create(RateLimitSchema, { requestsPerSecond: 5, burst: 10, perModelRequestsPerSecond: 2, perModelBurst: 3 }),
        'mlp',
      ),
    ).toEqual([
      { key: 'all', ratePerS: 5, burst: 10 },
      { key: 'model:mlp', ratePerS: 2, burst: 3 },
    ]);
  });

  it('gives a bucket without a burst its rate as burst, at least 1', () => {
    expect(bucketsOf(create(RateLimitSchema, { requestsPerSecond: 20, perModelRequestsPerSecond: 0.5 }), 'm')).toEqual([
      { key: 'all', ratePerS: 20, burst: 20 },
      { key: 'model:m', ratePerS: 0.5, burst: 1 },
    ]);
  });
});

describe(RateLimits.name, () => {
  /** The in-memory limiter, counting the calls that reach it. */
  class CountingLimiter extends MemoryRateLimiter {
    calls = 0;
    override take(scope: string, buckets: readonly Bucket[]): Promise<Decision> {
      this.calls += 1;
      return super.take(scope, buckets);
    }
  }
  const principal = (rateLimit: Principal['rateLimit']): Principal => ({
    keyId: '0123456789ab',
    scopes: new Set([Scope.INFER]),
    tenant: 't',
    models: new Set(),
    rateLimit,
  });

  it('never asks the limiter about a principal without limits', async () => {
    const limiter = new CountingLimiter();
    const sut = new RateLimits(limiter, new GatewayMetrics(new Metrics('gateway'), new ManualClock()), {
      rateLimitRedisDown: 'local',
    });
    for (let i = 0; i < 5; i++) {
      await sut.admit(principal(undefined), 'mlp');
      await sut.admit(principal(create(RateLimitSchema, {})), 'mlp');
    }
    expect(limiter.calls).toBe(0);
    await sut.admit(principal(create(RateLimitSchema, { requestsPerSecond: 1 })), 'mlp');
    expect(limiter.calls).toBe(1);
  });

  it('refuses a model name that no model can have when a limit per model applies', async () => {
    const sut = new RateLimits(new MemoryRateLimiter(), new GatewayMetrics(new Metrics('gateway'), new ManualClock()), {
      rateLimitRedisDown: 'local',
    });
    const error = await rpcRejection(
      sut.admit(principal(create(RateLimitSchema, { perModelRequestsPerSecond: 1 })), 'x'.repeat(1000)),
    );
    expect(error.code).toBe(status.INVALID_ARGUMENT);
  });
});

describe('gateway rate limits', () => {
  let gateway: RunningService;
  let grpc: ServiceClient<typeof GRPCInferenceService>;

  beforeAll(async () => {
    gateway = await start();
    grpc = createClient(GRPCInferenceService, `127.0.0.1:${gateway.grpcPort}`);
  });

  afterAll(async () => {
    grpc?.close();
    await gateway?.stop();
  });

  it('admits the burst of a key, then answers 429 with Retry-After and RESOURCE_EXHAUSTED with the retry delay, naming the limit', async () => {
    const { secret, id } = await createKey(gateway, { rateLimit: { requestsPerSecond: 0.001, burst: 3 } });
    const routed = upstreams.routerState.requests.length;

    expect(await statuses(gateway, secret, 3)).toEqual([200, 200, 200]);
    const refused = await infer(gateway, secret, 'tiny');
    expect(refused.status).toBe(429);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(999);
    expect(refused.json).toEqual({
      error: expect.stringMatching(
        new RegExp(`^rate limit of key apiKeys/${id}: 0\\.001 requests/s per key \\(burst 3\\); retry in \\d+ s$`),
      ),
    });
    const grpcRefused = await rpcRejection(grpc.modelInfer(grpcInfer('mlp'), { metadata: bearer(secret) }));
    expect([grpcRefused.code, grpcRefused.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'RATE_LIMITED']);
    expect(grpcRefused.retryDelayMs).toBeGreaterThan(990_000);
    expect(upstreams.routerState.requests.length - routed).toBe(3);
    expect(
      sample(await metricsOf(gateway), 'infermesh_gateway_rate_limited_total{bucket="key"}'),
    ).toBeGreaterThanOrEqual(2);
  });

  it('limits each model of a key apart with a limit per model', async () => {
    const { secret, id } = await createKey(gateway, {
      rateLimit: { perModelRequestsPerSecond: 0.001, perModelBurst: 2 },
    });
    const before = sample(await metricsOf(gateway), 'infermesh_gateway_rate_limited_total{bucket="model"}');

    expect(await statuses(gateway, secret, 3, 'mlp')).toEqual([200, 200, 429]);
    expect(await statuses(gateway, secret, 3, 'tiny')).toEqual([200, 200, 429]);
    const refused = await infer(gateway, secret, 'mlp');
    expect(refused.json).toEqual({
      error: expect.stringContaining(
        `rate limit of key apiKeys/${id} for model "mlp": 0.001 requests/s per model (burst 2)`,
      ),
    });
    expect(sample(await metricsOf(gateway), 'infermesh_gateway_rate_limited_total{bucket="model"}') - before).toBe(3);
  });

  it('keeps each key to its own buckets, and never limits a key without limits', async () => {
    const limited = await createKey(gateway, { rateLimit: { requestsPerSecond: 0.001, burst: 1 } });
    const other = await createKey(gateway, { rateLimit: { requestsPerSecond: 0.001, burst: 1 } });
    expect(await statuses(gateway, limited.secret, 2)).toEqual([200, 429]);
    expect(await statuses(gateway, other.secret, 2)).toEqual([200, 429]);
    expect(await statuses(gateway, ADMIN_KEY, 20)).toEqual(Array(20).fill(200));
  });
});

describe('gateway rate limits of GATEWAY_RATE_LIMIT_*', () => {
  let gateway: RunningService;

  beforeAll(async () => {
    gateway = await start({ GATEWAY_RATE_LIMIT_RPS: '0.001', GATEWAY_RATE_LIMIT_BURST: '2' });
  });

  afterAll(async () => {
    await gateway?.stop();
  });

  it('limits each configured key on its own, naming the limit and never the key', async () => {
    expect(await statuses(gateway, ADMIN_KEY, 3)).toEqual([200, 200, 429]);
    const refused = await infer(gateway, ADMIN_KEY);
    expect(refused.json).toEqual({
      error: expect.stringMatching(
        /^rate limit of this API key: 0\.001 requests\/s per key \(burst 2, GATEWAY_RATE_LIMIT_RPS\); retry in \d+ s$/,
      ),
    });
    expect(refused.text).not.toContain(ADMIN_KEY);
    expect(await statuses(gateway, OTHER_KEY, 3)).toEqual([200, 200, 429]);
  });

  it('applies them to stored keys without limits of their own, but not to those with their own', async () => {
    const defaults = await createKey(gateway, {});
    const own = await createKey(gateway, { rateLimit: { requestsPerSecond: 0.001, burst: 4 } });
    expect(await statuses(gateway, defaults.secret, 3)).toEqual([200, 200, 429]);
    expect(await statuses(gateway, own.secret, 5)).toEqual([200, 200, 200, 200, 429]);
  });
});

describe('gateway rate limits over time', () => {
  it('admits a refused key again once the retry delay it was given has passed, and not before', async () => {
    const clock = new ManualClock(Date.now());
    const gateway = await startTestGateway(
      upstreams.router.address,
      upstreams.registry.address,
      { GATEWAY_API_KEYS: ADMIN_KEY, GATEWAY_RATE_LIMIT_RPS: '1', GATEWAY_RATE_LIMIT_BURST: '1' },
      { clock },
    );
    try {
      expect(await statuses(gateway, ADMIN_KEY, 1)).toEqual([200]);
      const refused = await infer(gateway, ADMIN_KEY);
      expect([refused.status, refused.headers['retry-after']]).toEqual([429, '1']);
      clock.advance(999);
      expect((await infer(gateway, ADMIN_KEY)).status).toBe(429);
      clock.advance(1);
      expect(await statuses(gateway, ADMIN_KEY, 2)).toEqual([200, 429]);
    } finally {
      await gateway.stop();
    }
  });
});

describe('gateway rate limits in Redis', () => {
  let redis: RedisServer;

  beforeAll(async () => {
    redis = await startRedisServer();
  });

  afterAll(async () => {
    await redis?.stop();
  });

  it('shares the buckets of a key between the gateways of one Redis: the burst is admitted once in all', async () => {
    const first = await start({ REDIS_URL: redis.url });
    const second = await start({ REDIS_URL: redis.url });
    try {
      // Created through one gateway, the key is known to both.
      const { secret } = await createKey(first, { rateLimit: { requestsPerSecond: 0.001, burst: 3 } });
      let turn = 0;
      const alternate = () => (turn++ % 2 === 0 ? first : second);
      expect(await statuses(alternate, secret, 6)).toEqual([200, 200, 200, 429, 429, 429]);
    } finally {
      await first.stop();
      await second.stop();
    }
  });

  it.each<[string, (replies: Reply[]) => void]>([
    [
      'local',
      (replies) => {
        expect(replies.map((r) => r.status)).toEqual([200, 200, 429]);
      },
    ],
    [
      'closed',
      (replies) => {
        expect(replies.map((r) => r.status)).toEqual([503, 503, 503]);
        expect(replies[0]!.json).toEqual({
          error: expect.stringContaining('the rate-limit store (Redis) cannot be reached'),
        });
        expect(replies[0]!.headers['retry-after']).toBe('1');
      },
    ],
  ])('follows GATEWAY_RATE_LIMIT_REDIS_DOWN=%s while Redis is down, counting each fallback', async (policy, check) => {
    const own = await startRedisServer();
    const gateway = await start({
      REDIS_URL: own.url,
      GATEWAY_RATE_LIMIT_REDIS_DOWN: policy,
      GATEWAY_RATE_LIMIT_RPS: '0.001',
      GATEWAY_RATE_LIMIT_BURST: '2',
    });
    try {
      await own.stop();
      const replies: Reply[] = [];
      for (let i = 0; i < 3; i++) replies.push(await infer(gateway, ADMIN_KEY));
      check(replies);
      expect(sample(await metricsOf(gateway), `infermesh_gateway_rate_limit_fallbacks_total{policy="${policy}"}`)).toBe(
        3,
      );
    } finally {
      await gateway.stop();
    }
  });
});
