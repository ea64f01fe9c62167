import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type ApiKeyRecord,
  ApiKeySchema,
  RateLimitSchema,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { JsonLogger } from '@infermesh/telemetry';
import { rpcRejection } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApiKeyAuth, checkModelAccess } from './api-key-auth';
import { ApiKeyStore } from './api-keys/api-key-store';
import { EmbeddedApiKeyStore } from './api-keys/api-key-store.embedded';
import { ApiKeys, type Principal } from './api-keys/api-keys';

const logger = new JsonLogger('test', 'error', () => undefined);
const LAUNCHER_KEY = 'im_Zm9vYmFyX2Jhel9xdXV4LTAxMjM0NTY3';
const DEFAULT_LIMIT = create(RateLimitSchema, { requestsPerSecond: 7 });
const CONFIG = {
  apiKeys: [
    { key: 'first-key', scopes: [Scope.INFER, Scope.ADMIN] },
    { key: 'second-key', scopes: [Scope.INFER, Scope.ADMIN] },
    { key: 'infer-only-key', scopes: [Scope.INFER] },
    { key: 'admin-only-key', scopes: [Scope.ADMIN] },
    // What `infermesh up` generates when INFERMESH_API_KEY is unset: im_ and 24 random bytes in base64url.
    { key: LAUNCHER_KEY, scopes: [Scope.INFER, Scope.ADMIN] },
  ],
  defaultRateLimit: DEFAULT_LIMIT,
};

/** A store that cannot be reached, as Redis while it is down. */
class UnreachableStore extends ApiKeyStore {
  get(): Promise<ApiKeyRecord | undefined> {
    return Promise.reject(new Error('connect ECONNREFUSED 10.0.0.7:6379'));
  }
  list(): Promise<ApiKeyRecord[]> {
    return this.get().then(() => []);
  }
  put(): Promise<void> {
    return this.get().then(() => undefined);
  }
  async close(): Promise<void> {}
}

describe(ApiKeyAuth.name, () => {
  let dir: string;
  let keys: ApiKeys;
  let sut: ApiKeyAuth;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'api-key-auth-'));
    keys = new ApiKeys(new EmbeddedApiKeyStore(join(dir, 'api-keys.json')), { cacheMs: 0 });
    sut = new ApiKeyAuth(CONFIG, keys, logger);
  });

  afterEach(async () => {
    await sut.onApplicationShutdown();
    rmSync(dir, { recursive: true, force: true });
  });

  describe('configured keys (GATEWAY_API_KEYS)', () => {
    it.each(['Bearer first-key', 'Bearer second-key', 'bearer first-key', 'Bearer  first-key '])(
      'accepts %j',
      async (header) => {
        expect([...(await sut.verify(header)).scopes]).toEqual([Scope.INFER, Scope.ADMIN]);
      },
    );

    it('returns the principal of the key presented: its scopes, an id by position, every model, the default limits', async () => {
      expect(await sut.verify('Bearer infer-only-key')).toEqual({
        keyId: 'config:3',
        scopes: new Set([Scope.INFER]),
        tenant: expect.stringMatching(/^key:[0-9a-f]{32}$/),
        models: new Set(),
        rateLimit: DEFAULT_LIMIT,
      });
      expect([...(await sut.verify('Bearer admin-only-key')).scopes]).toEqual([Scope.ADMIN]);
    });

    it('gives each key its own tenant, a digest of the key that never contains it, whatever the header spelling', async () => {
      expect((await sut.verify('bearer   first-key ')).tenant).toBe((await sut.verify('Bearer first-key')).tenant);
      const first = await sut.verify('Bearer first-key');
      const again = await sut.verify('Bearer first-key');
      const second = await sut.verify('Bearer second-key');
      expect(first.tenant).toBe(again.tenant);
      expect(first.tenant).not.toBe(second.tenant);
      expect(first.tenant).not.toContain('first-key');
      expect([first.keyId, second.keyId]).toEqual(['config:1', 'config:2']);
    });

    it.each([
      ['no header', undefined, /missing API key/],
      ['an empty header', '', /missing API key/],
      ['another scheme', 'Basic first-key', /malformed/],
      ['a bare key', 'first-key', /malformed/],
      ['a wrong key', 'Bearer third-key', /invalid API key/],
      ['a prefix of a key', 'Bearer first', /invalid API key/],
      ['a key with extra characters', 'Bearer first-key2', /invalid API key/],
    ])('refuses %s with UNAUTHENTICATED, never echoing the key', async (_label, header, message) => {
      const error = await rpcRejection(sut.authorize(header, Scope.INFER));
      expect(error).toMatchObject({
        code: status.UNAUTHENTICATED,
        reason: 'UNAUTHENTICATED',
        message: expect.stringMatching(message),
      });
      expect(error.message).not.toContain('first-key');
    });

    it.each([
      ['infer-only-key', Scope.ADMIN, 'admin'],
      ['admin-only-key', Scope.INFER, 'infer'],
    ] as const)(
      'refuses %s a route that needs scope %i with PERMISSION_DENIED, naming the scope and never the key',
      async (key, scope, name) => {
        const error = await rpcRejection(sut.authorize(`Bearer ${key}`, scope));
        expect(error).toMatchObject({
          code: status.PERMISSION_DENIED,
          reason: 'PERMISSION_DENIED',
          message: `this API key lacks the ${name} scope`,
        });
      },
    );

    it("accepts the launcher's generated key as a configured key, though it starts as stored keys do", async () => {
      expect(await sut.authorize(`Bearer ${LAUNCHER_KEY}`, Scope.ADMIN)).toMatchObject({ keyId: 'config:5' });
    });

    it('authorizes a key for the scopes it has', async () => {
      await expect(sut.authorize('Bearer infer-only-key', Scope.INFER)).resolves.toMatchObject({ keyId: 'config:3' });
      await expect(sut.authorize('Bearer admin-only-key', Scope.ADMIN)).resolves.toMatchObject({ keyId: 'config:4' });
      await expect(sut.authorize('Bearer first-key', Scope.ADMIN)).resolves.toMatchObject({ keyId: 'config:1' });
    });
  });

  describe('stored keys', () => {
    it('accepts a stored key as its own principal: its id, scopes, tenant, models and limits', async () => {
      const limit = { requestsPerSecond: 2, burst: 4 };
      const { key, secret } = await keys.create(
        create(ApiKeySchema, { scopes: [Scope.INFER], tenant: 'team-a', models: ['mlp'], rateLimit: limit }),
      );
      const principal = await sut.authorize(`Bearer ${secret}`, Scope.INFER);
      expect(principal).toEqual({
        keyId: key.name.slice('apiKeys/'.length),
        scopes: new Set([Scope.INFER]),
        tenant: 'team-a',
        models: new Set(['mlp']),
        rateLimit: expect.objectContaining(limit),
      });
    });

    it('gives a stored key without limits of its own the default limits, and its id as tenant', async () => {
      const { key, secret } = await keys.create(create(ApiKeySchema, { scopes: [Scope.INFER] }));
      const id = key.name.slice('apiKeys/'.length);
      expect(await sut.verify(`Bearer ${secret}`)).toMatchObject({
        keyId: id,
        tenant: `key:${id}`,
        rateLimit: DEFAULT_LIMIT,
      });
    });

    it('refuses a wrong secret, an unknown id and a revoked key with UNAUTHENTICATED, saying which', async () => {
      const { key, secret } = await keys.create(create(ApiKeySchema, { scopes: [Scope.INFER, Scope.ADMIN] }));
      const wrong = `${secret.slice(0, -1)}${secret.endsWith('A') ? 'B' : 'A'}`;
      const unknown = `im_000000000000_${'a'.repeat(43)}`;
      for (const token of [wrong, unknown]) {
        expect(await rpcRejection(sut.verify(`Bearer ${token}`))).toMatchObject({
          code: status.UNAUTHENTICATED,
          message: 'invalid API key',
        });
      }
      await keys.revoke(key.name);
      const revoked = await rpcRejection(sut.verify(`Bearer ${secret}`));
      expect(revoked).toMatchObject({
        code: status.UNAUTHENTICATED,
        reason: 'UNAUTHENTICATED',
        message: 'this API key was revoked',
      });
    });

    it('checks the scopes of a stored key', async () => {
      const { secret: inferOnly } = await keys.create(create(ApiKeySchema, { scopes: [Scope.INFER] }));
      const { secret: adminOnly } = await keys.create(create(ApiKeySchema, { scopes: [Scope.ADMIN] }));
      expect(await rpcRejection(sut.authorize(`Bearer ${inferOnly}`, Scope.ADMIN))).toMatchObject({
        code: status.PERMISSION_DENIED,
        message: 'this API key lacks the admin scope',
      });
      expect(await rpcRejection(sut.authorize(`Bearer ${adminOnly}`, Scope.INFER))).toMatchObject({
        code: status.PERMISSION_DENIED,
        message: 'this API key lacks the infer scope',
      });
    });

    it("answers UNAVAILABLE, without the store's address, while the key store cannot be reached; configured keys still pass", async () => {
      const down = new ApiKeyAuth(CONFIG, new ApiKeys(new UnreachableStore(), { cacheMs: 0 }), logger);
      const error = await rpcRejection(down.verify(`Bearer im_0123456789ab_${'a'.repeat(43)}`));
      expect(error).toMatchObject({ code: status.UNAVAILABLE, message: expect.stringContaining('API key store') });
      expect(error.message).not.toContain('10.0.0.7');
      await expect(down.verify('Bearer first-key')).resolves.toMatchObject({ keyId: 'config:1' });
    });
  });
});

describe(checkModelAccess.name, () => {
  const principal = (models: string[]): Principal => ({
    keyId: 'k',
    scopes: new Set([Scope.INFER]),
    tenant: 't',
    models: new Set(models),
    rateLimit: undefined,
  });

  it('lets a key without a model list use every model, and one with a list only those', async () => {
    expect(() => checkModelAccess(principal([]), 'anything')).not.toThrow();
    expect(() => checkModelAccess(principal(['mlp', 'tiny']), 'tiny')).not.toThrow();
    const error = await rpcRejection(Promise.resolve().then(() => checkModelAccess(principal(['mlp']), 'tiny')));
    expect(error).toMatchObject({
      code: status.PERMISSION_DENIED,
      reason: 'PERMISSION_DENIED',
      message: 'this API key may not use model "tiny"',
    });
  });
});
