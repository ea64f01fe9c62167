import { BadRequestException, Controller, Get, HttpCode, Inject, Param, Post, Req, Res } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { requestContext } from '@infermesh/telemetry';
import type { Request, Response } from 'express';
import { Public } from './api-key.guard';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';
import { timeoutParameterMs } from './infer-parameters';
import { callerOf, ROUTING_KEY_HEADER } from './routing-key';
import { readJsonBody } from './json-body';
import { ModelCatalog, type ModelMetadata, type RepositoryEntry } from './model-catalog';
import { ModelInference } from './model-inference';
import { restRequestId } from './request-tracking.middleware';
import { inferRequestFromJson, inferResponseToJson, type JsonInferResponse } from './rest-codec';
import { type ServerMetadata, ServerStatus } from './server-status';

const TIMEOUT_HEADER = 'x-request-timeout-ms';

/** The KServe v2 / Open Inference Protocol REST API. */
@Controller('v2')
export class GatewayHttpController {
  constructor(
    private readonly server: ServerStatus,
    private readonly catalog: ModelCatalog,
    private readonly inference: ModelInference,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
  ) {}

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
    if (!ready) throw RpcError.unavailable('the server is not ready: the router or the registry is not serving');
    return { ready };
  }

  @Get('models/:model')
  modelMetadata(@Req() req: Request, @Res({ passthrough: true }) res: Response, @Param('model') model: string): Promise<ModelMetadata> {
    return this.within(req, res, undefined, () => this.catalog.metadata(model, ''));
  }

  @Get('models/:model/versions/:version')
  versionMetadata(
    @Req() req: Request,
    @Res({ passthrough: true }) res: Response,
    @Param('model') model: string,
    @Param('version') version: string,
  ): Promise<ModelMetadata> {
    return this.within(req, res, undefined, () => this.catalog.metadata(model, version));
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
    const body = await readJsonBody(req, res, this.config.maxBodyBytes);
    if (body !== undefined && (typeof body !== 'object' || body === null || Array.isArray(body))) {
      throw RpcError.invalidArgument('the request body must be a JSON object, e.g. {"ready": true}');
    }
    const readyOnly = (body as { ready?: unknown } | undefined)?.ready;
    if (readyOnly !== undefined && typeof readyOnly !== 'boolean') throw RpcError.invalidArgument('"ready" must be a boolean');
    return this.within(req, res, undefined, () => this.catalog.repositoryIndex(readyOnly === true));
  }

  private async modelReadiness(req: Request, res: Response, model: string, version: string) {
    const ready = await this.within(req, res, undefined, () => this.catalog.ready(model, version));
    const what = version === '' ? `model "${model}"` : `version "${version}" of model "${model}"`;
    if (!ready) throw new RpcError(status.UNAVAILABLE, `${what} is not ready`, { reason: 'MODEL_NOT_READY' });
    return version === '' ? { name: model, ready } : { name: model, version, ready };
  }

  private async infer(req: Request, res: Response, model: string, version: string): Promise<JsonInferResponse> {
    const body = await readJsonBody(req, res, this.config.maxBodyBytes);
    const request = { ...inferRequestFromJson(model, version, body), ...callerOf(req.header(ROUTING_KEY_HEADER), req.header('authorization')) };
    const aborted = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) aborted.abort();
    });
    return this.within(req, res, timeoutParameterMs(request.parameters), async () =>
      inferResponseToJson(await this.inference.infer(request, aborted.signal)),
    );
  }

  /**
   * Runs a use case inside the request's context: its id, and its deadline: the earliest of the
   * `x-request-timeout-ms` header and the Triton `timeout` parameter, else the configured default.
   * Upstream calls made inside carry both.
   */
  private within<T>(req: Request, res: Response, parameterTimeoutMs: number | undefined, fn: () => Promise<T>): Promise<T> {
    const timeouts = [headerTimeoutMs(req), parameterTimeoutMs].filter((t): t is number => t !== undefined);
    const timeoutMs = timeouts.length > 0 ? Math.min(...timeouts) : this.config.defaultTimeoutMs;
    return requestContext.run({ requestId: restRequestId(res), deadlineMs: Date.now() + timeoutMs }, fn);
  }
}

function headerTimeoutMs(req: Request): number | undefined {
  const value = req.header(TIMEOUT_HEADER);
  if (value === undefined) return undefined;
  if (!/^\d{1,10}$/.test(value.trim()) || Number(value) <= 0) {
    throw new BadRequestException(`${TIMEOUT_HEADER} must be a positive integer of milliseconds`);
  }
  return Number(value);
}
