import { status } from '@grpc/grpc-js';
import { create } from '@bufbuild/protobuf';
import { ApiKeySchema, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { createRedisClient, waitForRedis } from '@infermesh/redis';
import { JsonLogger } from '@infermesh/telemetry';
import { type RedisServer, rpcRejection, startRedisServer, ManualClock } from '@infermesh/testing';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ApiKeyStore } from './api-key-store';
import { EmbeddedApiKeyStore } from './api-key-store.embedded';
import { RedisApiKeyStore } from './api-key-store.redis';
import { ApiKeys } from './api-keys';

const logger = new JsonLogger('test', 'error');
const key = (init: Parameters<typeof create<typeof ApiKeySchema>>[1]) => create(ApiKeySchema, init);

let redis: RedisServer;
let dir: string;

beforeAll(async () => {
  redis = await startRedisServer();
  dir = mkdtempSync(join(tmpdir(), 'api-keys-'));
});

afterAll(async () => {
  await redis?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe.each([
  [
    'embedded',
    () => {
      const file = join(dir, `${Math.random().toString(36).slice(2)}.json`);
      return {
        shared: false,
        open: async (): Promise<ApiKeyStore> => new EmbeddedApiKeyStore(file),
        raw: () => readFileSync(file, 'utf8'),
      };
    },
  ],
  [
    'redis',
    () => {
      const prefix = `t${Math.random().toString(36).slice(2)}:`;
      const open = async (): Promise<ApiKeyStore> => {
        const client = createRedisClient(redis.url, logger, 'api-keys-test');
        await waitForRedis(client, 5_000);
        return new RedisApiKeyStore(client, prefix);
      };
      return {
        shared: true,
        open,
        raw: async () => {
          const client = createRedisClient(redis.url, logger, 'api-keys-raw');
          await waitForRedis(client, 5_000);
          const all = await client.hgetallBuffer(`${prefix}api-keys`);
          client.disconnect();
          return Object.values(all)
            .map((b) => b.toString('latin1'))
            .join('\n');
        },
      };
    },
  ],
])('%s store', (_name, backend) => {
  let clock: ManualClock;
  let stores: ApiKeyStore[];
  let open: () => Promise<ApiKeys>;
  let raw: () => string | Promise<string>;
  let shared: boolean;

  beforeEach(() => {
    clock = new ManualClock(1_700_000_000_000);
    stores = [];
    const made = backend();
    raw = made.raw;
    shared = made.shared;
    open = async () => {
      const store = await made.open();
      stores.push(store);
      return new ApiKeys(store, { cacheMs: 1_000, clock });
    };
  });

  afterEach(async () => {
    for (const store of stores) await store.close();
  });

  it('creates a key whose secret authenticates as its principal, and stores no secret', async () => {
    const sut = await open();
    const { key: created, secret } = await sut.create(
      key({ displayName: 'checkout', scopes: [Scope.INFER], models: ['mlp'], rateLimit: { requestsPerSecond: 5 } }),
    );

    expect(created.name).toMatch(/^apiKeys\/[0-9a-f]{12}$/);
    expect(secret).toMatch(/^im_[0-9a-f]{12}_/);
    const auth = await sut.authenticate(secret);
    expect(auth).toEqual({
      principal: {
        keyId: created.name.slice('apiKeys/'.length),
        scopes: new Set([Scope.INFER]),
        tenant: `key:${created.name.slice('apiKeys/'.length)}`,
        models: new Set(['mlp']),
        rateLimit: expect.objectContaining({ requestsPerSecond: 5 }),
      },
    });
    // The secret part is everything after `im_<id>_` (base64url: it may itself hold `_`).
    const secretPart = secret.slice(`im_${created.name.slice('apiKeys/'.length)}_`.length);
    expect(secretPart.length).toBeGreaterThanOrEqual(32);
    expect(await raw()).not.toContain(secretPart);
  });

  it('refuses a wrong secret for a real id, an unknown id, and leaves other formats to the caller', async () => {
    const sut = await open();
    const { secret } = await sut.create(key({ scopes: [Scope.ADMIN] }));
    const wrong = `${secret.slice(0, -1)}${secret.endsWith('A') ? 'B' : 'A'}`;

    expect(await sut.authenticate(wrong)).toEqual({ refused: 'invalid API key' });
    expect(await sut.authenticate('im_000000000000_' + 'a'.repeat(43))).toEqual({ refused: 'invalid API key' });
    expect(await sut.authenticate('some-configured-key')).toBeUndefined();
  });

  it('refuses a revoked key at once, and on every replica sharing the store once their cache time has passed', async () => {
    const first = await open();
    // Replicas share keys through Redis; an embedded store belongs to one gateway.
    const second = shared ? await open() : first;
    const { key: created, secret } = await first.create(key({ scopes: [Scope.INFER] }));
    expect(await second.authenticate(secret)).toHaveProperty('principal');

    const revoked = await first.revoke(created.name);

    expect(revoked.revokeTime).toBeDefined();
    expect(await first.authenticate(secret)).toEqual({ refused: 'this API key was revoked' });
    clock.advance(1_001);
    expect(await second.authenticate(secret)).toEqual({ refused: 'this API key was revoked' });
  });

  it('keeps keys across a restart', async () => {
    const sut = await open();
    const { key: created, secret } = await sut.create(
      key({ displayName: 'a', scopes: [Scope.INFER, Scope.ADMIN], tenant: 'team-a' }),
    );

    const restarted = await open();

    expect((await restarted.list()).map((k) => [k.name, k.displayName, k.tenant])).toEqual([
      [created.name, 'a', 'team-a'],
    ]);
    expect(await restarted.authenticate(secret)).toMatchObject({ principal: { tenant: 'team-a' } });
  });
});

describe(ApiKeys.name, () => {
  const sut = new ApiKeys(new EmbeddedApiKeyStore(join(tmpdir(), `api-keys-${process.pid}-${Date.now()}.json`)), {
    cacheMs: 1_000,
  });

  afterAll(async () => {
    await sut.close();
  });

  it.each([
    [key({}), /at least one scope/],
    [key({ scopes: [7 as Scope] }), /unknown scope 7/],
    [key({ scopes: [Scope.INFER], tenant: 'has space' }), /key\.tenant/],
    [key({ scopes: [Scope.INFER], models: [''] }), /key\.models/],
    [key({ scopes: [Scope.INFER], rateLimit: { requestsPerSecond: -1 } }), /rate_limit\.requests_per_second/],
    [
      key({ scopes: [Scope.INFER], rateLimit: { perModelRequestsPerSecond: Number.NaN } }),
      /per_model_requests_per_second/,
    ],
  ])('refuses key settings that cannot work, naming the field (%#)', async (init, message) => {
    const error = await rpcRejection(sut.create(init));
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(message);
  });

  it('refuses to revoke a malformed or unknown name', async () => {
    expect((await rpcRejection(sut.revoke('keys/1'))).code).toBe(status.INVALID_ARGUMENT);
    expect((await rpcRejection(sut.revoke('apiKeys/0123456789ab'))).code).toBe(status.NOT_FOUND);
  });
});
