import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { type ApiKeySchema, ApiKeyService, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { RunningService } from '@infermesh/runtime';
import { rpcRejection } from '@infermesh/testing';
import { ApiKeysAdminGrpcController } from './api-keys-admin.grpc';
import { ApiKeysAdminHttpController } from './api-keys-admin.http';
import {
  type FakeUpstreams,
  http,
  postJson,
  type Reply,
  startFakeUpstreams,
  startTestGateway,
} from '../testing/gateway-harness';

const ADMIN_KEY = 'keys-spec-admin-key-0123456789';
const INFER_KEY = 'keys-spec-infer-key-0123456789';
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const ADMIN = bearer(ADMIN_KEY);
const INPUT = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
const grpcInfer = (modelName: string) =>
  create(ModelInferRequestSchema, {
    modelName,
    inputs: [{ name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
  });

interface Created {
  key: {
    name: string;
    displayName?: string;
    scopes: string[];
    tenant?: string;
    models?: string[];
    createTime?: string;
    revokeTime?: string;
  };
  secret: string;
}

describe('gateway API keys', () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;
  let port: number;
  let keys: ServiceClient<typeof ApiKeyService>;
  let inference: ServiceClient<typeof GRPCInferenceService>;
  let registry: ServiceClient<typeof RegistryService>;

  beforeAll(async () => {
    upstreams = await startFakeUpstreams();
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, {
      GATEWAY_API_KEYS: `${ADMIN_KEY}:admin, ${INFER_KEY}:infer`,
    });
    port = gateway.httpPort!;
    const address = `127.0.0.1:${gateway.grpcPort}`;
    keys = createClient(ApiKeyService, address);
    inference = createClient(GRPCInferenceService, address);
    registry = createClient(RegistryService, address);
  });

  afterAll(async () => {
    keys?.close();
    inference?.close();
    registry?.close();
    await gateway?.stop();
    await upstreams?.stop();
  });

  /** Creates a stored key through the REST admin API. */
  async function createKey(init: Record<string, unknown>): Promise<Created> {
    const reply = await postJson(port, '/admin/v1/api-keys', init, ADMIN);
    expect([reply.status, reply.json]).toEqual([200, expect.objectContaining({ secret: expect.any(String) })]);
    return reply.json as Created;
  }

  const idOf = (created: Created) => created.key.name.slice('apiKeys/'.length);
  const lastRouted = () => upstreams.routerState.requests.at(-1)!.request;

  describe(ApiKeysAdminHttpController.name, () => {
    it('creates a key and answers its secret this once, lists keys without secrets, and revokes a key for good', async () => {
      const reply = await postJson(
        port,
        '/admin/v1/api-keys',
        {
          displayName: 'checkout',
          scopes: ['SCOPE_INFER'],
          tenant: 'team-a',
          models: ['mlp'],
          rateLimit: { requestsPerSecond: 5 },
        },
        ADMIN,
      );
      expect(reply.status).toBe(200);
      expect(reply.headers['cache-control']).toBe('no-store');
      const created = reply.json as Created;
      expect(created).toEqual({
        key: {
          name: expect.stringMatching(/^apiKeys\/[0-9a-f]{12}$/),
          displayName: 'checkout',
          scopes: ['SCOPE_INFER'],
          tenant: 'team-a',
          models: ['mlp'],
          rateLimit: { requestsPerSecond: 5 },
          createTime: expect.any(String),
        },
        secret: expect.stringMatching(new RegExp(`^im_${idOf(created)}_[A-Za-z0-9_-]{43}$`)),
      });
      expect((await postJson(port, '/v2/models/mlp/infer', { inputs: [INPUT] }, bearer(created.secret))).status).toBe(
        200,
      );

      const list = await http(port, 'GET', '/admin/v1/api-keys', { headers: ADMIN });
      expect(list.status).toBe(200);
      expect((list.json as { keys: unknown[] }).keys).toContainEqual(created.key);
      expect(list.text).not.toContain(created.secret.slice(-43));

      const revoked = await postJson(port, `/admin/v1/api-keys/${idOf(created)}/revoke`, {}, ADMIN);
      expect([revoked.status, revoked.json]).toEqual([200, { ...created.key, revokeTime: expect.any(String) }]);
      const refused = await postJson(port, '/v2/models/mlp/infer', { inputs: [INPUT] }, bearer(created.secret));
      expect([refused.status, refused.json]).toEqual([401, { error: 'this API key was revoked' }]);
      // Revoking again changes nothing.
      const again = await http(port, 'POST', `/admin/v1/api-keys/${idOf(created)}/revoke`, { headers: ADMIN });
      expect(again.json).toEqual(revoked.json);
    });

    it.each<[string, () => Promise<Reply>, number, RegExp]>([
      ['no body', () => http(port, 'POST', '/admin/v1/api-keys', { headers: ADMIN }), 400, /needs a JSON body/],
      [
        'an unknown field',
        () => postJson(port, '/admin/v1/api-keys', { scopes: ['SCOPE_INFER'], owner: 'x' }, ADMIN),
        400,
        /owner/,
      ],
      ['no scope', () => postJson(port, '/admin/v1/api-keys', { displayName: 'x' }, ADMIN), 400, /at least one scope/],
      [
        'a negative rate',
        () =>
          postJson(
            port,
            '/admin/v1/api-keys',
            { scopes: ['SCOPE_INFER'], rateLimit: { requestsPerSecond: -1 } },
            ADMIN,
          ),
        400,
        /requests_per_second/,
      ],
      [
        'a malformed id to revoke',
        () => http(port, 'POST', '/admin/v1/api-keys/xyz/revoke', { headers: ADMIN }),
        400,
        /apiKeys\/<12 hexadecimal digits>/,
      ],
      [
        'an unknown id to revoke',
        () => http(port, 'POST', '/admin/v1/api-keys/0123456789ab/revoke', { headers: ADMIN }),
        404,
        /apiKeys\/0123456789ab does not exist/,
      ],
      [
        'a body to revoke',
        () => postJson(port, '/admin/v1/api-keys/0123456789ab/revoke', { force: true }, ADMIN),
        400,
        /takes no body/,
      ],
      [
        'the wrong method',
        () => http(port, 'GET', '/admin/v1/api-keys/0123456789ab/revoke', { headers: ADMIN }),
        405,
        /use POST/,
      ],
    ])('refuses %s with a message naming the problem', async (_label, send, code, message) => {
      const reply = await send();
      expect([reply.status, reply.json]).toEqual([code, { error: expect.stringMatching(message) }]);
    });

    it('needs a key with the admin scope, configured or stored', async () => {
      const inferOnly = await createKey({ scopes: ['SCOPE_INFER'] });
      const adminOnly = await createKey({ scopes: ['SCOPE_ADMIN'] });
      for (const [headers, code] of [
        [{}, 401],
        [bearer(INFER_KEY), 403],
        [bearer(inferOnly.secret), 403],
      ] as const) {
        const replies = [
          await http(port, 'GET', '/admin/v1/api-keys', { headers }),
          await postJson(port, '/admin/v1/api-keys', { scopes: ['SCOPE_ADMIN'] }, headers),
          await http(port, 'POST', `/admin/v1/api-keys/${idOf(adminOnly)}/revoke`, { headers }),
        ];
        expect(replies.map((r) => r.status)).toEqual([code, code, code]);
      }
      expect((await http(port, 'GET', '/admin/v1/api-keys', { headers: bearer(adminOnly.secret) })).status).toBe(200);
      // The refused revocation did not happen.
      const listed = (await http(port, 'GET', '/admin/v1/api-keys', { headers: ADMIN })).json as {
        keys: Created['key'][];
      };
      expect(listed.keys.find((k) => k.name === adminOnly.key.name)?.revokeTime).toBeUndefined();
    });
  });

  describe(ApiKeysAdminGrpcController.name, () => {
    const init = (key: MessageInitShape<typeof ApiKeySchema>) => ({ key });

    it('creates, lists and revokes keys for an admin', async () => {
      const { key, secret } = await keys.createApiKey(
        init({ displayName: 'batch', scopes: [Scope.INFER], models: ['tiny'] }),
        { metadata: ADMIN },
      );
      expect(key).toMatchObject({
        name: expect.stringMatching(/^apiKeys\/[0-9a-f]{12}$/),
        displayName: 'batch',
        scopes: [Scope.INFER],
        models: ['tiny'],
      });
      expect(secret).toMatch(/^im_[0-9a-f]{12}_/);
      expect(
        await inference.modelMetadata({ name: 'mlp' }, { metadata: bearer(secret) }).catch((e: unknown) => e),
      ).toMatchObject({ code: status.PERMISSION_DENIED });

      const { keys: listed } = await keys.listApiKeys({}, { metadata: ADMIN });
      expect(listed.map((k) => k.name)).toContain(key!.name);

      const { key: revoked } = await keys.revokeApiKey({ name: key!.name }, { metadata: ADMIN });
      expect(revoked?.revokeTime).toBeDefined();
      const refused = await rpcRejection(inference.modelReady({ name: 'tiny' }, { metadata: bearer(secret) }));
      expect([refused.code, refused.message]).toEqual([status.UNAUTHENTICATED, 'this API key was revoked']);
    });

    it('refuses callers without the admin scope, and bad requests, naming the problem', async () => {
      expect((await rpcRejection(keys.listApiKeys({}))).code).toBe(status.UNAUTHENTICATED);
      const denied = await rpcRejection(
        keys.createApiKey(init({ scopes: [Scope.ADMIN] }), { metadata: bearer(INFER_KEY) }),
      );
      expect([denied.code, denied.message]).toEqual([status.PERMISSION_DENIED, 'this API key lacks the admin scope']);
      expect(
        (await rpcRejection(keys.revokeApiKey({ name: 'apiKeys/0123456789ab' }, { metadata: bearer(INFER_KEY) }))).code,
      ).toBe(status.PERMISSION_DENIED);
      const noScope = await rpcRejection(keys.createApiKey(init({ displayName: 'x' }), { metadata: ADMIN }));
      expect([noScope.code, noScope.message]).toEqual([
        status.INVALID_ARGUMENT,
        expect.stringContaining('at least one scope'),
      ]);
      expect((await rpcRejection(keys.revokeApiKey({ name: 'apiKeys/0123456789ab' }, { metadata: ADMIN }))).code).toBe(
        status.NOT_FOUND,
      );
    });
  });

  describe('authentication with stored keys', () => {
    it('accepts a valid key and refuses a wrong secret or a revoked key, over REST and gRPC', async () => {
      const created = await createKey({ scopes: ['SCOPE_INFER'] });
      const wrong = `${created.secret.slice(0, -1)}${created.secret.endsWith('A') ? 'B' : 'A'}`;
      expect((await http(port, 'GET', '/v2/models/mlp', { headers: bearer(created.secret) })).status).toBe(200);
      expect(await inference.modelReady({ name: 'mlp' }, { metadata: bearer(created.secret) })).toMatchObject({
        ready: true,
      });

      const rest = await http(port, 'GET', '/v2/models/mlp', { headers: bearer(wrong) });
      expect([rest.status, rest.json, rest.headers['www-authenticate']]).toEqual([
        401,
        { error: 'invalid API key' },
        'Bearer',
      ]);
      expect(rest.text).not.toContain(wrong);
      const grpc = await rpcRejection(inference.modelInfer(grpcInfer('mlp'), { metadata: bearer(wrong) }));
      expect([grpc.code, grpc.message]).toEqual([status.UNAUTHENTICATED, 'invalid API key']);

      await postJson(port, `/admin/v1/api-keys/${idOf(created)}/revoke`, {}, ADMIN);
      expect((await http(port, 'GET', '/v2/models/mlp', { headers: bearer(created.secret) })).json).toEqual({
        error: 'this API key was revoked',
      });
      expect(
        (await rpcRejection(inference.modelInfer(grpcInfer('mlp'), { metadata: bearer(created.secret) }))).message,
      ).toBe('this API key was revoked');
    });

    it('refuses an infer-only key the admin routes and an admin-only key inference, over REST and gRPC', async () => {
      const inferOnly = await createKey({ scopes: ['SCOPE_INFER'] });
      const adminOnly = await createKey({ scopes: ['SCOPE_ADMIN'] });

      const admin = await http(port, 'GET', '/admin/v1/models', { headers: bearer(inferOnly.secret) });
      expect([admin.status, admin.json]).toEqual([403, { error: 'this API key lacks the admin scope' }]);
      const grpcAdmin = await rpcRejection(registry.listModels({}, { metadata: bearer(inferOnly.secret) }));
      expect([grpcAdmin.code, grpcAdmin.message]).toEqual([
        status.PERMISSION_DENIED,
        'this API key lacks the admin scope',
      ]);

      const infer = await postJson(port, '/v2/models/mlp/infer', { inputs: [INPUT] }, bearer(adminOnly.secret));
      expect([infer.status, infer.json]).toEqual([403, { error: 'this API key lacks the infer scope' }]);
      const grpcInfer_ = await rpcRejection(
        inference.modelInfer(grpcInfer('mlp'), { metadata: bearer(adminOnly.secret) }),
      );
      expect([grpcInfer_.code, grpcInfer_.message]).toEqual([
        status.PERMISSION_DENIED,
        'this API key lacks the infer scope',
      ]);
      // Each key does what its scope allows.
      expect((await registry.listModels({}, { metadata: bearer(adminOnly.secret) })).models.length).toBeGreaterThan(0);
    });

    it("sends the key's tenant downstream, as the routing key unless x-routing-key names one; the key's id without a tenant", async () => {
      const withTenant = await createKey({ scopes: ['SCOPE_INFER'], tenant: 'team-a' });
      const withoutTenant = await createKey({ scopes: ['SCOPE_INFER'] });

      await postJson(port, '/v2/models/mlp/infer', { inputs: [INPUT] }, bearer(withTenant.secret));
      expect(lastRouted()).toMatchObject({ tenant: 'team-a', routingKey: 'team-a' });
      await inference.modelInfer(grpcInfer('mlp'), {
        metadata: { ...bearer(withTenant.secret), 'x-routing-key': 'user-7' },
      });
      expect(lastRouted()).toMatchObject({ tenant: 'team-a', routingKey: 'user-7' });
      await inference.modelInfer(grpcInfer('mlp'), { metadata: bearer(withoutTenant.secret) });
      expect(lastRouted()).toMatchObject({
        tenant: `key:${idOf(withoutTenant)}`,
        routingKey: `key:${idOf(withoutTenant)}`,
      });
    });
  });

  describe('model allow-list', () => {
    let secret: string;
    const as = () => bearer(secret);

    beforeAll(async () => {
      secret = (await createKey({ scopes: ['SCOPE_INFER'], models: ['mlp'] })).secret;
    });

    it.each([
      ['model metadata', 'GET', '/v2/models/:m'],
      ['version metadata', 'GET', '/v2/models/:m/versions/1'],
      ['model readiness', 'GET', '/v2/models/:m/ready'],
      ['version readiness', 'GET', '/v2/models/:m/versions/1/ready'],
      ['inference', 'POST', '/v2/models/:m/infer'],
      ['inference on a version', 'POST', '/v2/models/:m/versions/1/infer'],
    ])(
      'lets the key use only its models on REST %s: 403 naming any other, known or not',
      async (_label, method, path) => {
        const send = (model: string) =>
          method === 'GET'
            ? http(port, method, path.replace(':m', model), { headers: as() })
            : postJson(port, path.replace(':m', model), { inputs: [INPUT] }, as());
        const routed = upstreams.routerState.requests.length;
        for (const model of ['broken', 'nope']) {
          const reply = await send(model);
          expect([reply.status, reply.json]).toEqual([403, { error: `this API key may not use model "${model}"` }]);
        }
        expect(upstreams.routerState.requests).toHaveLength(routed);
        expect((await send('mlp')).status).not.toBe(403);
      },
    );

    it('lists only its models in the repository index, and still describes the server', async () => {
      const index = await postJson(port, '/v2/repository/index', {}, as());
      expect(index.json).toEqual([
        { name: 'mlp', version: '1', state: 'UNAVAILABLE' },
        { name: 'mlp', version: '2', state: 'READY' },
        { name: 'mlp', version: '3', state: 'LOADING' },
      ]);
      expect(((await postJson(port, '/v2/repository/index', {}, bearer(INFER_KEY))).json as unknown[]).length).toBe(4);
      expect((await http(port, 'GET', '/v2', { headers: as() })).status).toBe(200);
    });

    it('lets the key use only its models on gRPC ModelMetadata, ModelReady and ModelInfer', async () => {
      const metadata = as();
      const refusals = [
        await rpcRejection(inference.modelMetadata({ name: 'broken' }, { metadata })),
        await rpcRejection(inference.modelReady({ name: 'broken' }, { metadata })),
        await rpcRejection(inference.modelInfer(grpcInfer('tiny'), { metadata })),
      ];
      expect(refusals.map((e) => [e.code, e.reason])).toEqual(
        Array(3).fill([status.PERMISSION_DENIED, 'PERMISSION_DENIED']),
      );
      expect(refusals[2]!.message).toBe('this API key may not use model "tiny"');
      expect(await inference.modelMetadata({ name: 'mlp' }, { metadata })).toMatchObject({ name: 'mlp' });
      expect(await inference.modelReady({ name: 'mlp' }, { metadata })).toMatchObject({ ready: true });
      expect(await inference.modelInfer(grpcInfer('mlp'), { metadata })).toMatchObject({ modelName: 'mlp' });
    });
  });
});
