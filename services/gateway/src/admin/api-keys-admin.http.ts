import { create } from '@bufbuild/protobuf';
import { Controller, Get, Header, HttpCode, Inject, Param, Post, Req, Res } from '@nestjs/common';
import { Errors } from '@infermesh/grpc';
import {
  ApiKeySchema,
  CreateApiKeyResponseSchema,
  ListApiKeysResponseSchema,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import type { Request, Response } from 'express';
import { principalOf, RequireScope } from '../auth/api-key.guard';
import { ApiKeysAdmin } from './api-keys-admin';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { BodyBudget } from '../requests/body-budget';
import { type BodyLimits, readJsonBody, readNoBody } from '../requests/json-body';
import { messageFromJson, messageToJson } from './registry-json';

/**
 * The gateway's stored API keys over REST, for keys with the admin scope. Bodies and answers are
 * messages of infermesh.gateway.v1 in the protobuf JSON mapping:
 *
 *   POST /admin/v1/api-keys              ApiKey (displayName, scopes, tenant, models, rateLimit)
 *                                        → CreateApiKeyResponse, with the secret, shown this once
 *   GET  /admin/v1/api-keys              → ListApiKeysResponse (never a secret)
 *   POST /admin/v1/api-keys/{id}/revoke  → ApiKey, its revokeTime set
 */
@Controller('admin/v1/api-keys')
@RequireScope(Scope.ADMIN)
export class ApiKeysAdminHttpController {
  constructor(
    private readonly admin: ApiKeysAdmin,
    private readonly budget: BodyBudget,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
  ) {}

  private get bodyLimits(): BodyLimits {
    return { maxBytes: this.config.maxBodyBytes, budget: this.budget };
  }

  @Post()
  @HttpCode(200)
  @Header('cache-control', 'no-store')
  async create(@Req() req: Request, @Res({ passthrough: true }) res: Response) {
    const body = await readJsonBody(req, res, this.bodyLimits);
    if (body === undefined)
      throw Errors.invalidRequest(
        'the request needs a JSON body: an ApiKey, e.g. {"displayName": "checkout", "scopes": ["SCOPE_INFER"]}',
      );
    const created = await this.admin.create(messageFromJson(ApiKeySchema, body), principalOf(req));
    return messageToJson(CreateApiKeyResponseSchema, create(CreateApiKeyResponseSchema, created));
  }

  @Get()
  async list() {
    return messageToJson(
      ListApiKeysResponseSchema,
      create(ListApiKeysResponseSchema, { keys: await this.admin.list() }),
    );
  }

  @Post(':id/revoke')
  @HttpCode(200)
  async revoke(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('id') id: string) {
    await readNoBody(req, res, this.bodyLimits);
    return messageToJson(ApiKeySchema, await this.admin.revoke(`apiKeys/${id}`, principalOf(req)));
  }
}
