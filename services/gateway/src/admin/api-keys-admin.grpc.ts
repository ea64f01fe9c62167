import { status } from '@grpc/grpc-js';
import { Injectable } from '@nestjs/common';
import { type CallContext, type ServiceImpl, toRpcError } from '@infermesh/grpc';
import {
  type ApiKeyService,
  type CreateApiKeyRequest,
  type RevokeApiKeyRequest,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { ApiKeyAuth } from '../auth/api-key-auth';
import type { Principal } from '../auth/api-keys/api-keys';
import { ApiKeysAdmin } from './api-keys-admin';
import { GatewayMetrics } from '../gateway-metrics';

/**
 * The gateway's ApiKeyService on its gRPC port: create, list and revoke stored API keys. Every call
 * needs `authorization: Bearer <key>` metadata of a key with the admin scope. The secret of a new key
 * is in CreateApiKey's answer only.
 */
@Injectable()
export class ApiKeysAdminGrpcController implements ServiceImpl<typeof ApiKeyService> {
  constructor(
    private readonly auth: ApiKeyAuth,
    private readonly admin: ApiKeysAdmin,
    private readonly metrics: GatewayMetrics,
  ) {}

  createApiKey(request: CreateApiKeyRequest, ctx: CallContext) {
    return this.handle('CreateApiKey', ctx, (principal) => this.admin.create(request.key, principal));
  }

  listApiKeys(_request: unknown, ctx: CallContext) {
    return this.handle('ListApiKeys', ctx, async () => ({ keys: await this.admin.list() }));
  }

  revokeApiKey(request: RevokeApiKeyRequest, ctx: CallContext) {
    return this.handle('RevokeApiKey', ctx, async (principal) => ({
      key: await this.admin.revoke(request.name, principal),
    }));
  }

  /** Authorizes an admin, runs the call, and records its duration. */
  private async handle<T>(rpc: string, ctx: CallContext, fn: (principal: Principal) => Promise<T>): Promise<T> {
    const timer = this.metrics.startRequest('grpc');
    let code = status.OK;
    try {
      return await fn(await this.auth.authorize(ctx.metadata['authorization'], Scope.ADMIN));
    } catch (error) {
      code = toRpcError(error).code;
      throw error;
    } finally {
      timer.end(rpc, status[code] ?? String(code));
    }
  }
}
