import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import type { RateLimit, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { JsonLogger } from '@infermesh/telemetry';
import { createHash, timingSafeEqual } from 'node:crypto';
import { type Authentication, ApiKeys, type Principal } from './api-keys/api-keys';
import { GATEWAY_CONFIG, type GatewayConfig, scopeName } from '../gateway.config';

const sha256 = (value: string) => createHash('sha256').update(value, 'utf8').digest();

/** The key id of the n-th key of GATEWAY_API_KEYS (1 for the first): it names the key, never shows it. */
const configKeyId = (position: number) => `config:${position}`;

/**
 * The tenant of a configured key: a digest of the key, computed once, so that the key never leaves
 * the gateway and the header's spelling ("Bearer" or "bearer", spaces) does not change the tenant.
 */
function configTenant(key: string): string {
  return `key:${sha256(key).toString('hex').slice(0, 32)}`;
}

/**
 * Resolves `Authorization: Bearer <key>` to the principal it speaks for. A key in the stored format
 * (`im_<id>_<secret>`) is looked up among the stored keys (ApiKeys: created, listed and revoked through
 * the admin API); any other key is compared with GATEWAY_API_KEYS, as SHA-256 digests with
 * timingSafeEqual, every key every time, so neither the length nor the position of a match shows in
 * the timing. Keys are never logged or echoed. Closes the key store when the gateway stops.
 */
@Injectable()
export class ApiKeyAuth implements OnApplicationShutdown {
  private readonly keys: { digest: Buffer; principal: Principal }[];
  private readonly defaultRateLimit: RateLimit;

  constructor(
    @Inject(GATEWAY_CONFIG) config: Pick<GatewayConfig, 'apiKeys' | 'defaultRateLimit'>,
    private readonly stored: ApiKeys,
    private readonly logger: JsonLogger,
  ) {
    this.defaultRateLimit = config.defaultRateLimit;
    this.keys = config.apiKeys.map(({ key, scopes }, i) => ({
      digest: sha256(key),
      principal: {
        keyId: configKeyId(i + 1),
        scopes: new Set(scopes),
        tenant: configTenant(key),
        models: new Set(),
        rateLimit: config.defaultRateLimit,
      },
    }));
  }

  /** The principal of the key the header carries; UNAUTHENTICATED unless it carries an accepted key. */
  async verify(authorization: string | undefined): Promise<Principal> {
    if (authorization === undefined || authorization === '') {
      throw unauthenticated('missing API key: send "Authorization: Bearer <key>"');
    }
    const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization);
    if (match === null) throw unauthenticated('malformed Authorization header: expected "Bearer <key>"');
    const token = match[1]!;
    const stored = await this.lookup(token);
    if (stored !== undefined) {
      if ('refused' in stored) throw unauthenticated(stored.refused);
      const { principal } = stored;
      return principal.rateLimit === undefined ? { ...principal, rateLimit: this.defaultRateLimit } : principal;
    }
    const presented = sha256(token);
    let found: Principal | undefined;
    for (const key of this.keys) {
      const equal = timingSafeEqual(key.digest, presented);
      found = equal ? key.principal : found;
    }
    if (found === undefined) throw unauthenticated('invalid API key');
    return found;
  }

  /** Verifies the key (UNAUTHENTICATED), then that it has `scope` (PERMISSION_DENIED); its principal. */
  async authorize(authorization: string | undefined, scope: Scope): Promise<Principal> {
    const principal = await this.verify(authorization);
    if (!principal.scopes.has(scope)) {
      throw Errors.permissionDenied(`this API key lacks the ${scopeName(scope)} scope`);
    }
    return principal;
  }

  async onApplicationShutdown(): Promise<void> {
    await this.stored.close();
  }

  /** A stored key's authentication; undefined for a key in another format. The store's failures are UNAVAILABLE. */
  private async lookup(token: string): Promise<Authentication | undefined> {
    try {
      return await this.stored.authenticate(token);
    } catch (error) {
      if (error instanceof RpcError) throw error;
      this.logger.warn('API key store unreachable', { err: error instanceof Error ? error.message : String(error) });
      throw Errors.upstreamUnavailable('the API key store cannot be reached; retry later', { retryDelayMs: 1_000 });
    }
  }
}

/** Whether the principal may use `model`: every model unless its key names the models it may use. */
export function allowsModel(principal: Principal, model: string): boolean {
  return principal.models.size === 0 || principal.models.has(model);
}

/** PERMISSION_DENIED naming the model unless the principal may use it. */
export function checkModelAccess(principal: Principal, model: string): void {
  if (!allowsModel(principal, model)) {
    throw Errors.permissionDenied(`this API key may not use model "${model.slice(0, 100)}"`);
  }
}

function unauthenticated(message: string): RpcError {
  return Errors.unauthenticated(message);
}
