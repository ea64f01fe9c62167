import { Injectable } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import { type ApiKey, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { JsonLogger } from '@infermesh/telemetry';
import { ApiKeys, type Principal } from '../auth/api-keys/api-keys';
import { scopeName } from '../gateway.config';

/**
 * The admin API's use of the stored keys, over gRPC and REST alike: each change is logged (the key's
 * name, scopes and who made it; never its secret), and a store that cannot be reached or written is
 * UNAVAILABLE rather than an internal error.
 */
@Injectable()
export class ApiKeysAdmin {
  constructor(
    private readonly keys: ApiKeys,
    private readonly logger: JsonLogger,
  ) {}

  async create(init: ApiKey | undefined, by: Principal): Promise<{ key: ApiKey; secret: string }> {
    const created = await this.store(() => this.keys.create(init));
    this.logger.info('API key created', {
      key: created.key.name,
      display_name: created.key.displayName,
      scopes: created.key.scopes.map((s: Scope) => scopeName(s)).join('+'),
      by: by.keyId,
    });
    return created;
  }

  list(): Promise<ApiKey[]> {
    return this.store(() => this.keys.list());
  }

  async revoke(name: string, by: Principal): Promise<ApiKey> {
    const revoked = await this.store(() => this.keys.revoke(name));
    this.logger.info('API key revoked', { key: revoked.name, by: by.keyId });
    return revoked;
  }

  private async store<T>(operation: () => Promise<T>): Promise<T> {
    try {
      return await operation();
    } catch (error) {
      if (error instanceof RpcError) throw error;
      this.logger.warn('API key store failed', { err: error instanceof Error ? error.message : String(error) });
      throw Errors.upstreamUnavailable('the API key store cannot be reached or written; retry later', {
        retryDelayMs: 1_000,
      });
    }
  }
}
