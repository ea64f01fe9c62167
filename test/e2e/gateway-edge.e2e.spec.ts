import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, RpcError } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { serviceEntry, ServiceProcess } from '@infermesh/system';
import { freePortList, type RedisServer, startRedisServer } from '@infermesh/testing';
import { API_KEY, DIST, type Fixture, metricValue, startFixture } from './support/system-fixture';

type Credential = 'none' | 'wrong' | 'revoked' | 'wrong scope' | 'right scope';
const CREDENTIALS: Credential[] = ['none', 'wrong', 'revoked', 'wrong scope', 'right scope'];

interface Route {
  method: string;
  path: string;
  scope: 'infer' | 'admin';
  body?: string;
  /** The status with the right scope. */
  ok: number;
}

const TINY = JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [1, 2, 3, 4] }] });

/** Every route of the gateway's REST API that needs a key, with the scope it needs. */
const ROUTES: Route[] = [
  { method: 'GET', path: '/v2', scope: 'infer', ok: 200 },
  { method: 'GET', path: '/v2/models/tiny', scope: 'infer', ok: 200 },
  { method: 'GET', path: '/v2/models/tiny/versions/1', scope: 'infer', ok: 200 },
  { method: 'GET', path: '/v2/models/tiny/ready', scope: 'infer', ok: 200 },
  { method: 'GET', path: '/v2/models/tiny/versions/1/ready', scope: 'infer', ok: 200 },
  { method: 'POST', path: '/v2/models/tiny/infer', scope: 'infer', body: TINY, ok: 200 },
  { method: 'POST', path: '/v2/models/tiny/versions/1/infer', scope: 'infer', body: TINY, ok: 200 },
  { method: 'POST', path: '/v2/repository/index', scope: 'infer', ok: 200 },
  { method: 'GET', path: '/admin/v1/models', scope: 'admin', ok: 200 },
  { method: 'GET', path: '/admin/v1/models/tiny', scope: 'admin', ok: 200 },
  {
    method: 'PATCH',
    path: '/admin/v1/models/tiny',
    scope: 'admin',
    body: JSON.stringify({ labels: { audited: 'yes' } }),
    ok: 200,
  },
  {
    method: 'PUT',
    path: '/admin/v1/models/tiny/cache',
    scope: 'admin',
    body: JSON.stringify({ ttlMs: '60000' }),
    ok: 200,
  },
  { method: 'POST', path: '/v2/repository/models/tiny/load', scope: 'admin', ok: 200 },
  { method: 'GET', path: '/admin/v1/api-keys', scope: 'admin', ok: 200 },
];

/**
 * The gateway as the only door, against the real system with Redis: every route under every kind of
 * credential, and one rate limit shared by two gateway replicas.
 */
describe('the gateway edge: keys, scopes and shared rate limits', () => {
  let redis: RedisServer;
  let fixture: Fixture;
  const keys = {} as Record<'inferOnly' | 'adminOnly' | 'revoked', string>;

  const admin = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${fixture.system.gatewayUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
    const json = (await res.json()) as Record<string, unknown>;
    if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const createKey = async (key: unknown) => {
    const created = (await admin('POST', '/admin/v1/api-keys', key)) as { key: { name: string }; secret: string };
    return { id: created.key.name.slice('apiKeys/'.length), secret: created.secret };
  };

  /** The Authorization header for a credential on a route of the given scope; undefined for none. */
  const authorization = (credential: Credential, scope: 'infer' | 'admin'): string | undefined => {
    switch (credential) {
      case 'none':
        return undefined;
      case 'wrong':
        return 'Bearer im_0123456789ab_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA';
      case 'revoked':
        return `Bearer ${keys.revoked}`;
      case 'wrong scope':
        return `Bearer ${scope === 'infer' ? keys.adminOnly : keys.inferOnly}`;
      case 'right scope':
        return `Bearer ${scope === 'infer' ? keys.inferOnly : keys.adminOnly}`;
    }
  };
  const expected = (credential: Credential, route: Route) =>
    credential === 'right scope' ? route.ok : credential === 'wrong scope' ? 403 : 401;

  const routerRequests = () => metricValue(fixture.system.metricsUrl('router'), 'infermesh_router_requests_total');

  beforeAll(async () => {
    redis = await startRedisServer();
    fixture = await startFixture({ models: ['tiny'], redisUrl: redis.url, env: { ROUTER_CACHE_ENABLED: 'false' } });
    keys.inferOnly = (await createKey({ displayName: 'infer only', scopes: ['SCOPE_INFER'] })).secret;
    keys.adminOnly = (await createKey({ displayName: 'admin only', scopes: ['SCOPE_ADMIN'] })).secret;
    const revoked = await createKey({ displayName: 'revoked', scopes: ['SCOPE_INFER', 'SCOPE_ADMIN'] });
    await admin('POST', `/admin/v1/api-keys/${revoked.id}/revoke`);
    keys.revoked = revoked.secret;
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    await redis?.stop();
  });

  it('answers every REST route under every credential with exactly the expected status, and no refused request reaches a model', async () => {
    const before = await routerRequests();
    const mismatches: string[] = [];
    let admittedInferences = 0;
    for (const route of ROUTES) {
      for (const credential of CREDENTIALS) {
        const header = authorization(credential, route.scope);
        const res = await fetch(`${fixture.system.gatewayUrl}${route.path}`, {
          method: route.method,
          headers: { ...(header !== undefined && { authorization: header }), 'content-type': 'application/json' },
          ...(route.body !== undefined && { body: route.body }),
        });
        const body = (await res.json()) as { error?: string };
        if (res.status !== expected(credential, route))
          mismatches.push(`${route.method} ${route.path} with ${credential}: ${res.status} ${JSON.stringify(body)}`);
        if (res.status >= 400 && typeof body.error !== 'string')
          mismatches.push(`${route.method} ${route.path} with ${credential}: no error message`);
        if (route.path.endsWith('/infer') && res.status === 200) admittedInferences += 1;
      }
    }
    for (const path of ['/v2/health/live', '/v2/health/ready']) {
      for (const credential of CREDENTIALS) {
        const header = authorization(credential, 'infer');
        const res = await fetch(`${fixture.system.gatewayUrl}${path}`, {
          headers: header !== undefined ? { authorization: header } : {},
        });
        if (res.status !== 200) mismatches.push(`GET ${path} with ${credential}: ${res.status}`);
      }
    }

    expect(mismatches).toEqual([]);
    expect(admittedInferences).toBe(2);
    // Only the two admitted inferences reached the router.
    expect((await routerRequests()) - before).toBe(2);
  });

  it('answers every gRPC method under every credential with the expected code', async () => {
    const inference = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    const registry = createClient(RegistryService, fixture.system.gatewayGrpcAddress);
    const code = async (call: Promise<unknown>) =>
      call.then(
        () => 'OK',
        (error: unknown) => (error instanceof RpcError ? (status[error.code] ?? String(error.code)) : String(error)),
      );
    const grpcExpected = (credential: Credential) =>
      credential === 'right scope' ? 'OK' : credential === 'wrong scope' ? 'PERMISSION_DENIED' : 'UNAUTHENTICATED';
    const seen: string[] = [];
    const wanted: string[] = [];
    try {
      for (const credential of CREDENTIALS) {
        const metadata = (scope: 'infer' | 'admin') => {
          const header = authorization(credential, scope);
          const headers: Record<string, string> = header !== undefined ? { authorization: header } : {};
          return { metadata: headers, timeoutMs: 10_000 };
        };
        const calls: [string, Promise<unknown>][] = [
          [
            'ModelInfer',
            inference.modelInfer(
              create(ModelInferRequestSchema, {
                modelName: 'tiny',
                inputs: [
                  { name: 'input', datatype: 'FP32', shape: [1n, 4n], contents: { fp32Contents: [1, 2, 3, 4] } },
                ],
              }),
              metadata('infer'),
            ),
          ],
          ['ModelMetadata', inference.modelMetadata({ name: 'tiny' }, metadata('infer'))],
          ['ModelReady', inference.modelReady({ name: 'tiny' }, metadata('infer'))],
          ['ServerMetadata', inference.serverMetadata({}, metadata('infer'))],
          ['ListModels', registry.listModels({}, metadata('admin'))],
          ['GetModel', registry.getModel({ name: 'models/tiny' }, metadata('admin'))],
        ];
        for (const [name, call] of calls) {
          seen.push(`${name} with ${credential}: ${await code(call)}`);
          wanted.push(`${name} with ${credential}: ${grpcExpected(credential)}`);
        }
      }
    } finally {
      inference.close();
      registry.close();
    }
    expect(seen).toEqual(wanted);
  });

  it('shares one rate limit between two gateway replicas: together they admit the configured rate within 10 %', async () => {
    const RATE = 40;
    const BURST = 5;
    const DURATION_MS = 6_000;
    const { secret } = await createKey({
      displayName: 'limited',
      scopes: ['SCOPE_INFER'],
      rateLimit: { requestsPerSecond: RATE, burst: BURST },
    });

    // A second gateway replica: the same router, registry and Redis, its own ports.
    const [http, grpc, metrics] = await freePortList(3);
    const second = new ServiceProcess(
      'gateway',
      serviceEntry(DIST, 'gateway'),
      {
        ...fixture.system.envFor('gateway'),
        GATEWAY_HTTP_PORT: String(http),
        GATEWAY_GRPC_PORT: String(grpc),
        GATEWAY_METRICS_PORT: String(metrics),
      },
      () => undefined,
    );
    second.start();
    try {
      const secondUrl = `http://127.0.0.1:${http}`;
      for (const end = Date.now() + 30_000; ;) {
        const ready = await fetch(`${secondUrl}/v2/health/ready`).then(
          (r) => r.status,
          () => 0,
        );
        if (ready === 200) break;
        if (Date.now() > end) throw new Error('the second gateway did not become ready');
        await new Promise((r) => setTimeout(r, 100));
      }

      const counts = { admitted: 0, limited: 0, other: [] as number[] };
      const started = Date.now();
      const loop = async (url: string) => {
        while (Date.now() - started < DURATION_MS) {
          const res = await fetch(`${url}/v2/models/tiny/infer`, {
            method: 'POST',
            headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
            body: TINY,
          });
          await res.arrayBuffer();
          if (res.status === 200) counts.admitted += 1;
          else if (res.status === 429) counts.limited += 1;
          else counts.other.push(res.status);
          await new Promise((r) => setTimeout(r, 5));
        }
      };
      await Promise.all([fixture.system.gatewayUrl, fixture.system.gatewayUrl, secondUrl, secondUrl].map(loop));
      const elapsedS = (Date.now() - started) / 1000;

      const allowed = BURST + RATE * elapsedS;
      console.log(
        `two gateways sharing ${RATE} requests/s (burst ${BURST}) for ${elapsedS.toFixed(1)} s: admitted ${counts.admitted} ` +
          `(${(counts.admitted / allowed).toFixed(3)} of the ${allowed.toFixed(0)} allowed), refused ${counts.limited}`,
      );
      expect(counts.other).toEqual([]);
      expect(counts.limited).toBeGreaterThan(counts.admitted);
      expect(Math.abs(counts.admitted - allowed) / allowed).toBeLessThanOrEqual(0.1);
    } finally {
      await second.stop();
    }
  }, 60_000);
});
