import type { MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { Controller, Delete, Get, HttpCode, Inject, Param, Patch, Post, Put, Req, Res } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { Errors, RpcError, type ServiceClient } from '@infermesh/grpc';
import {
  ArtifactSchema,
  CachePolicySchema,
  CreateModelVersionRequestSchema,
  ListModelsResponseSchema,
  ModelSchema,
  ModelVersionSchema,
  QuantizeModelVersionRequestSchema,
  type RegistryService,
  RolloutPolicySchema,
  SetWeightsSchema,
  type UploadArtifactRequestSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { checkedModelName, checkedVersionName, checkVersionId } from '@infermesh/rollout';
import type { Request, Response } from 'express';
import { RequireScope } from '../auth/api-key.guard';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { startAutoRolloutFromJson } from './auto-rollout-request';
import { BodyBudget } from '../requests/body-budget';
import { type BodyLimits, readJsonBody, readNoBody } from '../requests/json-body';
import { RegistryClient } from '../upstreams/registry.client';
import { jsonObject, messageFromJson, messageToJson } from './registry-json';
import { clientGone, withinRequest } from '../requests/rest-context';

type Registry = ServiceClient<typeof RegistryService>;

/** The header that carries the SHA-256 the uploader computed, checked by the registry against the bytes. */
const ARTIFACT_SHA256_HEADER = 'x-artifact-sha256';

/**
 * The admin API over REST: Triton's model control, and the registry under /admin/v1. Every route needs
 * a key with the admin scope. Bodies and answers are registry messages in the protobuf JSON mapping
 * (lowerCamelCase or .proto field names; int64 as strings; unknown fields refused).
 *
 *   POST   /v2/repository/models/{m}/load                  UpdateModel unloaded=false → {}
 *   POST   /v2/repository/models/{m}/unload                UpdateModel unloaded=true  → {}
 *   GET    /admin/v1/models                                → ListModelsResponse
 *   GET    /admin/v1/models/{m}                            → Model
 *   PATCH  /admin/v1/models/{m}          Model (the fields present are the update mask) → Model
 *   DELETE /admin/v1/models/{m}                            → {}
 *   POST   /admin/v1/artifacts           the ONNX bytes, application/octet-stream,
 *                                        optional x-artifact-sha256 → Artifact
 *   POST   /admin/v1/models/{m}/versions CreateModelVersionRequest without parent → ModelVersion
 *   POST   /admin/v1/models/{m}/versions/{v}/retire        → ModelVersion
 *   POST   /admin/v1/models/{m}/versions/{v}/quantize  optional QuantizeModelVersionRequest
 *                                        without source → ModelVersion (the int8 variant)
 *   PUT    /admin/v1/models/{m}/rollout  RolloutPolicy     → Model
 *   POST   /admin/v1/models/{m}/rollout/promote  optional {"version": "2"} → Model
 *   POST   /admin/v1/models/{m}/rollout/rollback           → Model
 *   POST   /admin/v1/models/{m}/rollout/weights  SetWeights, e.g. {"percents": {"2": 10}} → Model
 *   POST   /admin/v1/models/{m}/rollout/auto     {"version": "3", "analysis": AutoRolloutAnalysis}
 *                                        StartAutoRollout → Model
 *   POST   /admin/v1/models/{m}/rollout/auto/resume       StartAutoRollout resume → Model
 *   POST   /admin/v1/models/{m}/rollout/pause             UpdateRollout pause → Model
 *   PUT    /admin/v1/models/{m}/cache    CachePolicy       → Model
 *
 * Errors are {"error": "..."} with the status of the registry's code (FAILED_PRECONDITION, e.g.
 * retiring a version that serves, is a 409; an artifact over the registry's size limit a 413).
 */
@Controller()
@RequireScope(Scope.ADMIN)
export class RegistryAdminHttpController {
  constructor(
    private readonly registry: RegistryClient,
    private readonly budget: BodyBudget,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
    private readonly clock: Clock,
  ) {}

  private get bodyLimits(): BodyLimits {
    return { maxBytes: this.config.maxBodyBytes, budget: this.budget };
  }

  @Post('v2/repository/models/:model/load')
  @HttpCode(200)
  async load(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ): Promise<object> {
    return this.setUnloaded(req, res, model, false);
  }

  @Post('v2/repository/models/:model/unload')
  @HttpCode(200)
  async unload(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ): Promise<object> {
    return this.setUnloaded(req, res, model, true);
  }

  @Get('admin/v1/models')
  async listModels(@Req() req: Request, @Res({ passthrough: true }) res: Response) {
    return messageToJson(ListModelsResponseSchema, await this.call(req, res, (r) => r.listModels({})));
  }

  @Get('admin/v1/models/:model')
  async getModel(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    const { model: found } = await this.call(req, res, (r) => r.getModel({ name }));
    return messageToJson(ModelSchema, required(found, 'model'));
  }

  @Patch('admin/v1/models/:model')
  async updateModel(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    const json = jsonObject(await this.body(req, res), 'a Model with the fields to change, e.g. {"pinned": true}');
    const changes = messageFromJson(ModelSchema, json);
    if ('name' in json && changes.name !== name) {
      throw Errors.invalidRequest(`"name" is "${changes.name}" but the path names "${name}"; leave "name" out`);
    }
    changes.name = name;
    const paths = Object.keys(json)
      .map((key) => ModelSchema.fields.find((f) => f.jsonName === key || f.name === key)!.name)
      .filter((path) => path !== 'name');
    if (paths.length === 0) {
      throw Errors.invalidRequest(
        'the request body names no field to change: give one or more of "labels", "pinned", "versionPolicy", "unloaded"',
      );
    }
    const { model: updated } = await this.call(req, res, (r) =>
      r.updateModel({ model: changes, updateMask: { paths } }),
    );
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  @Delete('admin/v1/models/:model')
  async deleteModel(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ): Promise<object> {
    const name = checkedModelName(model);
    await this.call(req, res, (r) => r.deleteModel({ name }));
    return {};
  }

  /**
   * Streams the request body into UploadArtifact chunk by chunk as it arrives, with backpressure: the
   * gateway never holds the artifact, and its JSON body limit does not apply; the registry's size limit
   * does. Only the caller's x-request-timeout-ms bounds it; a client that goes away cancels it.
   */
  @Post('admin/v1/artifacts')
  @HttpCode(200)
  async uploadArtifact(@Req() req: Request, @Res({ passthrough: true }) res: Response) {
    const type = req.headers['content-type']?.split(';')[0]?.trim().toLowerCase();
    if (type !== 'application/octet-stream') {
      throw Errors.unsupportedMediaType(
        `send the artifact's bytes as the body with Content-Type application/octet-stream (got ${type === undefined ? 'none' : `"${type}"`})`,
      );
    }
    const encoding = req.headers['content-encoding'];
    if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
      throw Errors.unsupportedMediaType(
        `Content-Encoding "${encoding}" is not supported; send the artifact uncompressed`,
      );
    }
    const expectedSha256 = req.header(ARTIFACT_SHA256_HEADER)?.trim() ?? '';
    try {
      const { artifact } = await withinRequest(
        req,
        res,
        { nowMs: this.clock.now(), defaultTimeoutMs: undefined, maxTimeoutMs: this.config.maxTimeoutMs },
        () => this.registry.forward((r) => r.uploadArtifact(uploadRequests(req, expectedSha256))),
        clientGone(res),
      );
      return messageToJson(ArtifactSchema, required(artifact, 'artifact'));
    } catch (error) {
      // The registry's size refusal carries its limit in the ErrorInfo metadata (maxBytes): a 413 here.
      const tooLarge =
        error instanceof RpcError &&
        (error.metadata['maxBytes'] !== undefined || error.code === status.RESOURCE_EXHAUSTED);
      throw tooLarge ? Errors.payloadTooLarge(error.message, { metadata: error.metadata }) : error;
    }
  }

  @Post('admin/v1/models/:model/versions')
  @HttpCode(200)
  async createModelVersion(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ) {
    const parent = checkedModelName(model);
    const request = messageFromJson(CreateModelVersionRequestSchema, await this.body(req, res));
    if (request.parent !== '')
      throw Errors.invalidRequest(`leave "parent" out of the request body: the path names the model ("${parent}")`);
    request.parent = parent;
    const { version } = await this.call(req, res, (r) => r.createModelVersion(request));
    return messageToJson(ModelVersionSchema, required(version, 'version'));
  }

  @Post('admin/v1/models/:model/versions/:version/retire')
  @HttpCode(200)
  async retireModelVersion(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ) {
    const name = checkedVersionName(model, version);
    await this.noBody(req, res);
    const { version: retired } = await this.call(req, res, (r) => r.retireModelVersion({ name }));
    return messageToJson(ModelVersionSchema, required(retired, 'version'));
  }

  @Post('admin/v1/models/:model/versions/:version/quantize')
  @HttpCode(200)
  async quantizeModelVersion(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ) {
    const source = checkedVersionName(model, version);
    // No body: every default (the next version of the same model, synthetic calibration, the default gate).
    const request = messageFromJson(
      QuantizeModelVersionRequestSchema,
      (await readJsonBody(req, res, this.bodyLimits)) ?? {},
    );
    if (request.source !== '')
      throw Errors.invalidRequest(`leave "source" out of the request body: the path names the version ("${source}")`);
    request.source = source;
    const { version: derived } = await this.call(req, res, (r) => r.quantizeModelVersion(request));
    return messageToJson(ModelVersionSchema, required(derived, 'version'));
  }

  @Put('admin/v1/models/:model/rollout')
  async setRolloutPolicy(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ) {
    const name = checkedModelName(model);
    const policy = messageFromJson(RolloutPolicySchema, await this.body(req, res));
    const { model: updated } = await this.call(req, res, (r) => r.setRolloutPolicy({ model: name, policy }));
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  @Post('admin/v1/models/:model/rollout/promote')
  @HttpCode(200)
  async promote(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    const body = await readJsonBody(req, res, this.bodyLimits);
    let version = '';
    if (body !== undefined) {
      const { version: given, ...rest } = jsonObject(body, '{"version": "<id>"}, or no body to promote the canary');
      const unknown = Object.keys(rest);
      if (unknown.length > 0)
        throw Errors.invalidRequest(`unknown field "${unknown[0]}" in the request body: expected only "version"`);
      if (given !== undefined) {
        if (typeof given !== 'string')
          throw Errors.invalidRequest('"version" must be a version id as a string, e.g. "2"');
        version = checkVersionId(given);
      }
    }
    return this.updateRollout(req, res, { model: name, action: { case: 'promote', value: version } });
  }

  @Post('admin/v1/models/:model/rollout/rollback')
  @HttpCode(200)
  async rollback(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    await this.noBody(req, res);
    return this.updateRollout(req, res, { model: name, action: { case: 'rollback', value: true } });
  }

  @Post('admin/v1/models/:model/rollout/weights')
  @HttpCode(200)
  async setWeights(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    const weights = messageFromJson(SetWeightsSchema, await this.body(req, res));
    return this.updateRollout(req, res, { model: name, action: { case: 'setWeights', value: weights } });
  }

  /** Starts an automatic rollout: the body's version becomes the canary and moves through the analysis's steps. */
  @Post('admin/v1/models/:model/rollout/auto')
  @HttpCode(200)
  async startAutoRollout(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ) {
    const request = startAutoRolloutFromJson(await this.body(req, res), checkedModelName(model));
    const { model: updated } = await this.call(req, res, (r) => r.startAutoRollout(request));
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  /** Resumes the model's paused automatic rollout at its step. */
  @Post('admin/v1/models/:model/rollout/auto/resume')
  @HttpCode(200)
  async resumeAutoRollout(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ) {
    const name = checkedModelName(model);
    await this.noBody(req, res);
    const { model: updated } = await this.call(req, res, (r) => r.startAutoRollout({ model: name, resume: true }));
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  /** Pauses the model's automatic rollout where it is; the policy stays. */
  @Post('admin/v1/models/:model/rollout/pause')
  @HttpCode(200)
  async pause(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    await this.noBody(req, res);
    return this.updateRollout(req, res, { model: name, action: { case: 'pause', value: true } });
  }

  @Put('admin/v1/models/:model/cache')
  async setCachePolicy(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    const name = checkedModelName(model);
    const policy = messageFromJson(CachePolicySchema, await this.body(req, res));
    const { model: updated } = await this.call(req, res, (r) => r.setCachePolicy({ model: name, policy }));
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  private async updateRollout(req: Request, res: Response, request: Parameters<Registry['updateRollout']>[0]) {
    const { model: updated } = await this.call(req, res, (r) => r.updateRollout(request));
    return messageToJson(ModelSchema, required(updated, 'model'));
  }

  /**
   * Triton's load and unload: the model's `unloaded` flag. Triton's request parameters are refused,
   * but `unload_dependents`, which Triton's clients send and which has nothing to act on here.
   */
  private async setUnloaded(req: Request, res: Response, model: string, unloaded: boolean): Promise<object> {
    const name = checkedModelName(model);
    const body = await readJsonBody(req, res, this.bodyLimits);
    if (body !== undefined) {
      const { parameters, ...rest } = jsonObject(body, '{} or {"parameters": {...}}');
      const unknown = Object.keys(rest);
      if (unknown.length > 0)
        throw Errors.invalidRequest(`unknown field "${unknown[0]}" in the request body: expected only "parameters"`);
      if (parameters !== undefined) {
        if (typeof parameters !== 'object' || parameters === null || Array.isArray(parameters)) {
          throw Errors.invalidRequest('"parameters" must be a JSON object');
        }
        const refused = Object.keys(parameters).filter((p) => p !== 'unload_dependents');
        if (refused.length > 0) {
          throw Errors.invalidRequest(
            `model control parameter "${refused[0]}" is not supported: a model's configuration comes from its registered versions`,
          );
        }
      }
    }
    await this.call(req, res, (r) => r.updateModel({ model: { name, unloaded }, updateMask: { paths: ['unloaded'] } }));
    return {};
  }

  /** A JSON body that must be there. */
  private async body(req: Request, res: Response): Promise<unknown> {
    const body = await readJsonBody(req, res, this.bodyLimits);
    if (body === undefined) throw Errors.invalidRequest('the request needs a JSON body');
    return body;
  }

  private noBody(req: Request, res: Response): Promise<void> {
    return readNoBody(req, res, this.bodyLimits);
  }

  /** Forwards one call to the registry with the request's id and deadline, cancelled when the client goes away. */
  private call<T>(req: Request, res: Response, call: (registry: Registry) => Promise<T>): Promise<T> {
    return withinRequest(
      req,
      res,
      {
        nowMs: this.clock.now(),
        defaultTimeoutMs: this.config.defaultTimeoutMs,
        maxTimeoutMs: this.config.maxTimeoutMs,
      },
      () => this.registry.forward(call),
      clientGone(res),
    );
  }
}

/**
 * The messages of an upload: each chunk of the body as it arrives, the expected SHA-256 with the
 * first. The body's stream is not destroyed when the upload stops early, so the refusal can still be
 * answered on it.
 */
async function* uploadRequests(
  req: Request,
  expectedSha256: string,
): AsyncGenerator<MessageInitShape<typeof UploadArtifactRequestSchema>> {
  let first = true;
  try {
    for await (const chunk of req.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) {
      yield first ? { chunk, expectedSha256 } : { chunk };
      first = false;
    }
  } catch {
    throw Errors.cancelled(
      'the upload was cancelled: the client closed the connection before the whole artifact arrived',
    );
  }
  if (first && expectedSha256 !== '') yield { expectedSha256 };
}

/** A message field the registry always sets; INTERNAL when it did not. */
function required<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw Errors.internal(`the registry answered without a ${what}`);
  return value;
}
