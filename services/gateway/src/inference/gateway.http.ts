import { Controller, Get, HttpCode, Inject, Param, Post, Req, Res, StreamableFile } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { Errors } from '@infermesh/grpc';
import type { Request, Response } from 'express';
import { Readable } from 'node:stream';
import { allowsModel, checkModelAccess } from '../auth/api-key-auth';
import { principalOf, Public } from '../auth/api-key.guard';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { BodyBudget } from '../requests/body-budget';
import { edgeParameters } from './infer-parameters';
import { callerOf, ROUTING_KEY_HEADER } from './routing-key';
import { type BodyLimits, INFERENCE_HEADER_LENGTH, readInferBody, readJsonBody } from '../requests/json-body';
import { ModelLookup, type ModelMetadata, type RepositoryEntry } from './model-lookup';
import { ModelInference } from './model-inference';
import { RateLimits } from '../auth/rate-limits';
import { clientGone, withinRequest } from '../requests/rest-context';
import { inferResponseToBinary, inferResponseToJson, type JsonInferResponse, restInferRequest } from './rest-codec';
import { type ServerMetadata, ServerStatus } from '../server-status';
import { checkName } from './tensor-limits';

/**
 * The KServe v2 / Open Inference Protocol REST API. A key that names the models it may use is refused
 * (403) every other model, and sees only its own in the repository index; inference is rate limited.
 */
@Controller('v2')
export class GatewayHttpController {
  constructor(
    private readonly server: ServerStatus,
    private readonly models: ModelLookup,
    private readonly inference: ModelInference,
    private readonly rateLimits: RateLimits,
    private readonly budget: BodyBudget,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
    private readonly clock: Clock,
  ) {}

  private get bodyLimits(): BodyLimits {
    return { maxBytes: this.config.maxBodyBytes, budget: this.budget };
  }

  /** Refuses a model name or version over GATEWAY_MAX_NAME_BYTES before it is used (as a key, in a message, upstream). */
  private checkNames(model: string, version = ''): void {
    checkName('model name', model, this.config.tensorLimits);
    checkName('model version', version, this.config.tensorLimits);
  }

  @Get()
  serverMetadata(): ServerMetadata {
    return this.server.metadata();
  }

  @Public()
  @Get('health/live')
  live(): { live: boolean } {
    return { live: true };
  }

  @Public()
  @Get('health/ready')
  async ready(@Req() req: Request, @Res({ passthrough: true }) res: Response): Promise<{ ready: boolean }> {
    const ready = await this.within(req, res, undefined, () => this.server.ready());
    if (!ready)
      throw Errors.upstreamUnavailable(
        'the server is not ready: it is starting or stopping, or the router is not serving',
      );
    return { ready };
  }

  @Get('models/:model')
  modelMetadata(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
  ): Promise<ModelMetadata> {
    this.checkNames(model);
    checkModelAccess(principalOf(req), model);
    return this.within(req, res, undefined, () => this.models.metadata(model, ''));
  }

  @Get('models/:model/versions/:version')
  versionMetadata(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ): Promise<ModelMetadata> {
    this.checkNames(model, version);
    checkModelAccess(principalOf(req), model);
    return this.within(req, res, undefined, () => this.models.metadata(model, version));
  }

  @Get('models/:model/ready')
  modelReady(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    return this.modelReadiness(req, res, model, '');
  }

  @Get('models/:model/versions/:version/ready')
  versionReady(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ) {
    return this.modelReadiness(req, res, model, version);
  }

  @Post('models/:model/infer')
  @HttpCode(200)
  modelInfer(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string) {
    return this.infer(req, res, model, '');
  }

  @Post('models/:model/versions/:version/infer')
  @HttpCode(200)
  versionInfer(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ) {
    return this.infer(req, res, model, version);
  }

  @Post('repository/index')
  @HttpCode(200)
  async repositoryIndex(@Req() req: Request, @Res({ passthrough: true }) res: Response): Promise<RepositoryEntry[]> {
    const body = await readJsonBody(req, res, this.bodyLimits);
    if (body !== undefined && (typeof body !== 'object' || body === null || Array.isArray(body))) {
      throw Errors.invalidRequest('the request body must be a JSON object, e.g. {"ready": true}');
    }
    const readyOnly = (body as { ready?: unknown } | undefined)?.ready;
    if (readyOnly !== undefined && typeof readyOnly !== 'boolean')
      throw Errors.invalidRequest('"ready" must be a boolean');
    const principal = principalOf(req);
    return this.within(req, res, undefined, () =>
      this.models.repositoryIndex(readyOnly === true, (model) => allowsModel(principal, model)),
    );
  }

  private async modelReadiness(req: Request, res: Response, model: string, version: string) {
    this.checkNames(model, version);
    checkModelAccess(principalOf(req), model);
    const ready = await this.within(req, res, undefined, () => this.models.ready(model, version));
    const what = version === '' ? `model "${model}"` : `version "${version}" of model "${model}"`;
    if (!ready) throw Errors.modelNotReady(`${what} is not ready`);
    return version === '' ? { name: model, ready } : { name: model, version, ready };
  }

  /**
   * Checks the key may use the model, that the concurrency limit has a place and the rate limits
   * before the body is read: a refusal costs little. The place is taken once the body has arrived
   * whole (where a gRPC call takes it, its message whole): a request still being sent holds none, so
   * that clients sending slowly, or sending headers and never a body, cannot fill the limit and have
   * every other request refused. The body is JSON or, with Inference-Header-Content-Length, Triton's
   * binary tensor data extension; outputs asked for as binary data come back as raw bytes after a
   * JSON header.
   */
  private async infer(
    req: Request,
    res: Response,
    model: string,
    version: string,
  ): Promise<JsonInferResponse | StreamableFile> {
    const principal = principalOf(req);
    this.checkNames(model, version);
    checkModelAccess(principal, model);
    const refusal = this.inference.refusal();
    if (refusal !== undefined) throw refusal;
    await this.rateLimits.admit(principal, model);
    const body = await readInferBody(req, res, this.bodyLimits);
    const admission = this.inference.admit();
    try {
      const decoded = restInferRequest(model, version, body.json, {
        limits: this.config.tensorLimits,
        binaryData: body.binaryData,
      });
      const request = { ...decoded.request, ...callerOf(req.header(ROUTING_KEY_HEADER), principal) };
      const signal = clientGone(res);
      return await this.within(req, res, edgeParameters(request.parameters).timeoutMs, async () => {
        const response = await this.inference.infer(admission, request, signal);
        const binary = inferResponseToBinary(response, decoded.binaryOutputs);
        if (binary === undefined) return inferResponseToJson(response);
        res.setHeader(INFERENCE_HEADER_LENGTH, String(binary.headerLength));
        return new StreamableFile(Readable.from(binary.chunks), {
          type: 'application/octet-stream',
          length: binary.byteLength,
        });
      });
    } finally {
      admission.release();
    }
  }

  /** Runs a use case inside the request's context: its id and its deadline, the configured default unless the request names one. */
  private within<T>(
    req: Request,
    res: Response,
    parameterTimeoutMs: number | undefined,
    fn: () => Promise<T>,
  ): Promise<T> {
    return withinRequest(
      req,
      res,
      {
        nowMs: this.clock.now(),
        parameterTimeoutMs,
        defaultTimeoutMs: this.config.defaultTimeoutMs,
        maxTimeoutMs: this.config.maxTimeoutMs,
      },
      fn,
    );
  }
}
