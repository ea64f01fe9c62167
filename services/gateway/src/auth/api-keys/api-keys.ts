import { type Clock, systemClock } from '@infermesh/clock';
import { clone, create } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import { Errors } from '@infermesh/grpc';
import {
  type ApiKey,
  ApiKeyRecordSchema,
  ApiKeySchema,
  type RateLimit,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { timingSafeEqual } from 'node:crypto';
import { generateKey, hashSecret, newSalt, parseKey } from './api-key-secret';
import { type ApiKeyStore } from './api-key-store';

/** Who a request comes from, once its key is accepted. */
export interface Principal {
  /** The key's id; `config:<n>` for the n-th key of GATEWAY_API_KEYS. Rate limits are kept per key id. */
  keyId: string;
  scopes: ReadonlySet<Scope>;
  /** Scopes cached results and sticky rollouts. */
  tenant: string;
  /** The models the key may call; empty: every model. */
  models: ReadonlySet<string>;
  /** The key's own limits; undefined: the gateway's defaults. */
  rateLimit: RateLimit | undefined;
}

export type Authentication = { principal: Principal } | { refused: string };

const API_KEY_NAME = /^apiKeys\/([0-9a-f]{12})$/;
const TENANT = /^[A-Za-z0-9._:-]{1,64}$/;
const MAX_MODELS = 1_000;
const MAX_RATE = 1_000_000;

export interface ApiKeysOptions {
  /** How long a looked-up record is reused: a revocation applies within this time on every replica. */
  cacheMs: number;
  /** Time (systemClock unless given). */
  clock?: Clock;
}

/**
 * The gateway's stored API keys: created with scopes, a tenant, an optional model allow-list and
 * rate limits; listed; revoked. The secret is returned once at creation and only its salted hash is
 * stored. Lookups are cached for `cacheMs` (unknown ids too, so guessing costs the store nothing).
 */
export class ApiKeys {
  private readonly cache = new Map<string, { at: number; record: Promise<Awaited<ReturnType<ApiKeyStore['get']>>> }>();
  private readonly clock: Clock;

  constructor(
    private readonly store: ApiKeyStore,
    private readonly options: ApiKeysOptions,
  ) {
    this.clock = options.clock ?? systemClock;
  }

  async create(init: ApiKey | undefined): Promise<{ key: ApiKey; secret: string }> {
    const key = checkApiKey(init);
    const { id, key: secret, secret: rawSecret } = generateKey();
    key.name = `apiKeys/${id}`;
    key.createTime = timestampFromDate(new Date(this.clock.now()));
    key.revokeTime = undefined;
    const salt = newSalt();
    await this.store.put(id, create(ApiKeyRecordSchema, { key, salt, secretSha256: hashSecret(salt, rawSecret) }));
    this.cache.delete(id);
    return { key, secret };
  }

  async list(): Promise<ApiKey[]> {
    return (await this.store.list()).map((r) => r.key!).filter((k) => k !== undefined);
  }

  async revoke(name: string): Promise<ApiKey> {
    const id = API_KEY_NAME.exec(name)?.[1];
    if (id === undefined) throw Errors.invalidRequest(`name must be apiKeys/<12 hexadecimal digits>, got "${name}"`);
    const record = await this.store.get(id);
    if (record?.key === undefined)
      throw Errors.apiKeyNotFound(`API key ${name} does not exist`, { metadata: { name } });
    if (record.key.revokeTime === undefined) {
      record.key.revokeTime = timestampFromDate(new Date(this.clock.now()));
      await this.store.put(id, record);
    }
    this.cache.delete(id);
    return record.key;
  }

  /**
   * The principal of a presented key in the stored-key format, a refusal naming why (revoked,
   * unknown), or undefined when the string is not in that format at all.
   */
  async authenticate(presented: string): Promise<Authentication | undefined> {
    const parsed = parseKey(presented);
    if (parsed === undefined) return undefined;
    const record = await this.lookup(parsed.id);
    if (record?.key === undefined) return { refused: 'invalid API key' };
    const expected = Buffer.from(record.secretSha256);
    const actual = Buffer.from(hashSecret(record.salt, parsed.secret));
    if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) return { refused: 'invalid API key' };
    if (record.key.revokeTime !== undefined) return { refused: 'this API key was revoked' };
    return {
      principal: {
        keyId: parsed.id,
        scopes: new Set(record.key.scopes),
        tenant: record.key.tenant !== '' ? record.key.tenant : `key:${parsed.id}`,
        models: new Set(record.key.models),
        rateLimit: record.key.rateLimit,
      },
    };
  }

  async close(): Promise<void> {
    await this.store.close();
  }

  private lookup(id: string) {
    const now = this.clock.now();
    const cached = this.cache.get(id);
    if (cached !== undefined && now - cached.at < this.options.cacheMs) return cached.record;
    const record = this.store.get(id);
    this.cache.set(id, { at: now, record });
    // A failed lookup is not remembered: the next request asks the store again.
    record.catch(() => this.cache.delete(id));
    if (this.cache.size > 100_000) this.cache.delete(this.cache.keys().next().value!);
    return record;
  }
}

/** The settings of a key to create, checked; a copy without the fields the gateway sets. */
function checkApiKey(init: ApiKey | undefined): ApiKey {
  if (init === undefined) throw Errors.invalidRequest('key is required');
  const key = clone(ApiKeySchema, init);
  const scopes = [...new Set(key.scopes)];
  if (scopes.length === 0)
    throw Errors.invalidRequest('key.scopes must name at least one scope: SCOPE_INFER, SCOPE_ADMIN');
  for (const scope of scopes) {
    if (scope !== Scope.INFER && scope !== Scope.ADMIN)
      throw Errors.invalidRequest(`key.scopes: unknown scope ${scope}; use SCOPE_INFER or SCOPE_ADMIN`);
  }
  key.scopes = scopes.sort();
  if (key.displayName.length > 100 || /[\u0000-\u001f\u007f]/.test(key.displayName)) {
    throw Errors.invalidRequest('key.display_name must be at most 100 printable characters');
  }
  if (key.tenant !== '' && !TENANT.test(key.tenant)) {
    throw Errors.invalidRequest(
      `key.tenant must be 1 to 64 characters of A-Z a-z 0-9 . _ : -, got "${key.tenant.slice(0, 80)}"`,
    );
  }
  if (key.models.length > MAX_MODELS) throw Errors.invalidRequest(`key.models may name at most ${MAX_MODELS} models`);
  for (const model of key.models) {
    if (model === '' || model.length > 64)
      throw Errors.invalidRequest(`key.models: "${model.slice(0, 80)}" is not a model name`);
  }
  key.models = [...new Set(key.models)];
  const limit = key.rateLimit;
  if (limit !== undefined) {
    for (const [field, value] of [
      ['requests_per_second', limit.requestsPerSecond],
      ['burst', limit.burst],
      ['per_model_requests_per_second', limit.perModelRequestsPerSecond],
      ['per_model_burst', limit.perModelBurst],
    ] as const) {
      if (!Number.isFinite(value) || value < 0 || value > MAX_RATE) {
        throw Errors.invalidRequest(`key.rate_limit.${field} must be between 0 and ${MAX_RATE}, got ${value}`);
      }
    }
  }
  return key;
}
