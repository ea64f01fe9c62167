import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { type CallContext, methodPath, type RpcError, type ServiceImpl, toRpcError } from '@infermesh/grpc';
import {
  GRPCInferenceService,
  type ModelInferRequest,
  type ModelMetadataRequest,
  type ModelReadyRequest,
} from '@infermesh/proto/gen/inference/grpc_service_pb';
import { Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { requestContext } from '@infermesh/telemetry';
import { ApiKeyAuth, checkModelAccess } from '../auth/api-key-auth';
import type { Principal } from '../auth/api-keys/api-keys';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { GatewayMetrics } from '../gateway-metrics';
import { inferRequestFromGrpc, inferResponseToGrpc } from './grpc-codec';
import { BodyBudget, type BodyReservation } from '../requests/body-budget';
import { edgeParameters } from './infer-parameters';
import { requestDeadline } from '../requests/request-deadline';
import { checkName } from './tensor-limits';
import { callerOf, ROUTING_KEY_HEADER } from './routing-key';
import { ModelLookup, type TensorMetadata } from './model-lookup';
import { type Admission, ModelInference } from './model-inference';
import { RateLimits } from '../auth/rate-limits';
import { ServerStatus } from '../server-status';

const MODEL_INFER_PATH = methodPath(GRPCInferenceService.method.modelInfer);

const grpcTensor = (t: TensorMetadata) => ({ name: t.name, datatype: t.datatype, shape: t.shape.map(BigInt) });

/**
 * The KServe v2 GRPCInferenceService. ServerLive and ServerReady are open; the other RPCs need
 * `authorization: Bearer <key>` metadata of a key with the infer scope, and a key that names the
 * models it may use is refused (PERMISSION_DENIED) every other one. ModelInfer is rate limited. Calls
 * without a deadline get the configured default.
 */
@Injectable()
export class GatewayGrpcController implements ServiceImpl<typeof GRPCInferenceService> {
  constructor(
    private readonly auth: ApiKeyAuth,
    private readonly server: ServerStatus,
    private readonly models: ModelLookup,
    private readonly inference: ModelInference,
    private readonly rateLimits: RateLimits,
    private readonly metrics: GatewayMetrics,
    private readonly budget: BodyBudget,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
    private readonly clock: Clock,
  ) {}

  serverLive(_request: unknown, ctx: CallContext) {
    return this.handle('ServerLive', ctx, { open: true }, async () => ({ live: true }));
  }

  serverReady(_request: unknown, ctx: CallContext) {
    return this.handle('ServerReady', ctx, { open: true }, async () => ({ ready: await this.server.ready() }));
  }

  modelReady(request: ModelReadyRequest, ctx: CallContext) {
    return this.handle('ModelReady', ctx, { model: request.name, version: request.version }, async () => ({
      ready: await this.models.ready(request.name, request.version),
    }));
  }

  serverMetadata(_request: unknown, ctx: CallContext) {
    return this.handle('ServerMetadata', ctx, {}, async () => this.server.metadata());
  }

  modelMetadata(request: ModelMetadataRequest, ctx: CallContext) {
    return this.handle('ModelMetadata', ctx, { model: request.name, version: request.version }, async () => {
      const metadata = await this.models.metadata(request.name, request.version);
      return { ...metadata, inputs: metadata.inputs.map(grpcTensor), outputs: metadata.outputs.map(grpcTensor) };
    });
  }

  /**
   * The refusal of a call arriving while the gateway is at its concurrency limit, for inference
   * only: answered before grpc-js reads it (GrpcServer.shedWith). A call let through takes its place
   * in `handle`, and may still be refused there.
   */
  refuseEarly(path: string): RpcError | undefined {
    if (path !== MODEL_INFER_PATH) return undefined;
    const timer = this.metrics.startRequest('grpc');
    const refusal = this.inference.refusal();
    if (refusal !== undefined) timer.end('ModelInfer', status[refusal.code]);
    return refusal;
  }

  modelInfer(request: ModelInferRequest, ctx: CallContext) {
    const options = {
      model: request.modelName,
      version: request.modelVersion,
      inference: true,
      bodyBytes: ctx.requestBytes ?? 0,
      timeout: () => edgeParameters(request.parameters).timeoutMs,
    };
    return this.handle('ModelInfer', ctx, options, async (principal, admission) =>
      inferResponseToGrpc(
        await this.inference.infer(
          admission!,
          {
            ...inferRequestFromGrpc(request, this.config.tensorLimits),
            ...callerOf(ctx.metadata[ROUTING_KEY_HEADER], principal!),
          },
          ctx.signal,
        ),
      ),
    );
  }

  /**
   * Refuses names over GATEWAY_MAX_NAME_BYTES, authenticates (unless open), checks the key may use
   * the call's model and, for inference, takes a place under the concurrency limit, then checks its
   * rate limits and the budget of request bytes in flight;
   * runs the handler with the call's deadline, the earliest of the gRPC deadline and a Triton
   * `timeout` parameter, else the configured default, at most GATEWAY_MAX_REQUEST_TIMEOUT_MS; and
   * records the call's duration.
   */
  private async handle<T>(
    rpc: string,
    ctx: CallContext,
    options: {
      open?: boolean;
      model?: string;
      version?: string;
      inference?: boolean;
      bodyBytes?: number;
      timeout?: () => number | undefined;
    },
    fn: (principal: Principal | undefined, admission: Admission | undefined) => Promise<T>,
  ): Promise<T> {
    const timer = this.metrics.startRequest('grpc');
    let code = status.OK;
    let reservation: BodyReservation | undefined;
    let admission: Admission | undefined;
    try {
      if (options.model !== undefined) checkName('model name', options.model, this.config.tensorLimits);
      if (options.version !== undefined) checkName('model version', options.version, this.config.tensorLimits);
      const principal =
        options.open === true ? undefined : await this.auth.authorize(ctx.metadata['authorization'], Scope.INFER);
      if (principal !== undefined && options.model !== undefined) {
        checkModelAccess(principal, options.model);
        if (options.inference === true) {
          admission = this.inference.admit();
          await this.rateLimits.admit(principal, options.model);
        }
      }
      // grpc-js holds the message already: what is counted is what stays held until the answer.
      if (options.bodyBytes !== undefined) reservation = this.budget.reserve(options.bodyBytes);
      const deadlineMs = requestDeadline(
        { grpcDeadlineMs: ctx.deadlineMs, parameterTimeoutMs: options.timeout?.() },
        { defaultMs: this.config.defaultTimeoutMs, maxMs: this.config.maxTimeoutMs },
        this.clock.now(),
      );
      const span = requestContext.current()?.span;
      return await requestContext.run(
        { requestId: ctx.requestId, deadlineMs, ...(span !== undefined && { span }) },
        () => fn(principal, admission),
      );
    } catch (error) {
      code = toRpcError(error).code;
      throw error;
    } finally {
      reservation?.release();
      admission?.release();
      timer.end(rpc, status[code] ?? String(code));
    }
  }
}
