import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { type CallContext, Errors, type ServiceClient, type ServiceImpl, toRpcError } from '@infermesh/grpc';
import type {
  CreateModelVersionRequest,
  DeleteModelRequest,
  DownloadArtifactRequest,
  GetModelRequest,
  ListModelsRequest,
  QuantizeModelVersionRequest,
  RegistryService,
  ResolveModelVersionRequest,
  RetireModelVersionRequest,
  SetCachePolicyRequest,
  SetRolloutPolicyRequest,
  StartAutoRolloutRequest,
  UpdateModelRequest,
  UpdateRolloutRequest,
  UploadArtifactRequest,
  WatchModelsRequest,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { requestContext } from '@infermesh/telemetry';
import { ApiKeyAuth } from '../auth/api-key-auth';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { GatewayMetrics } from '../gateway-metrics';
import { RegistryClient } from '../upstreams/registry.client';

type Registry = ServiceClient<typeof RegistryService>;

/**
 * The registry's RegistryService on the gateway's gRPC port, for administrators: every call needs
 * `authorization: Bearer <key>` metadata of a key with the admin scope, and is forwarded to the
 * registry with the caller's deadline, request id and cancellation; the registry's errors come back
 * with their code, message and ErrorInfo. Unary calls without a deadline get the configured default;
 * the streaming ones (UploadArtifact, DownloadArtifact, WatchModels) only the caller's, and pass
 * their messages on one by one as they come, with backpressure, never gathering them.
 * ReportVersionState is the workers' own and is refused; ReportTraffic, the routers' own, is not served
 * here at all (UNIMPLEMENTED).
 */
@Injectable()
export class RegistryAdminGrpcController implements ServiceImpl<typeof RegistryService> {
  constructor(
    private readonly auth: ApiKeyAuth,
    private readonly registry: RegistryClient,
    private readonly metrics: GatewayMetrics,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
    private readonly clock: Clock,
  ) {}

  uploadArtifact(requests: AsyncIterable<UploadArtifactRequest>, ctx: CallContext) {
    return this.unary('UploadArtifact', ctx, { streaming: true }, (r) => r.uploadArtifact(requests));
  }

  downloadArtifact(request: DownloadArtifactRequest, ctx: CallContext) {
    return this.serverStream('DownloadArtifact', ctx, (r) => r.downloadArtifact(request));
  }

  createModelVersion(request: CreateModelVersionRequest, ctx: CallContext) {
    return this.unary('CreateModelVersion', ctx, {}, (r) => r.createModelVersion(request));
  }

  getModel(request: GetModelRequest, ctx: CallContext) {
    return this.unary('GetModel', ctx, {}, (r) => r.getModel(request));
  }

  listModels(request: ListModelsRequest, ctx: CallContext) {
    return this.unary('ListModels', ctx, {}, (r) => r.listModels(request));
  }

  resolveModelVersion(request: ResolveModelVersionRequest, ctx: CallContext) {
    return this.unary('ResolveModelVersion', ctx, {}, (r) => r.resolveModelVersion(request));
  }

  reportVersionState(_request: unknown, ctx: CallContext) {
    return this.unary('ReportVersionState', ctx, {}, async (): Promise<never> => {
      throw Errors.permissionDenied(
        'ReportVersionState is reported by workers only, straight to the registry; the gateway does not forward it',
      );
    });
  }

  setRolloutPolicy(request: SetRolloutPolicyRequest, ctx: CallContext) {
    return this.unary('SetRolloutPolicy', ctx, {}, (r) => r.setRolloutPolicy(request));
  }

  updateRollout(request: UpdateRolloutRequest, ctx: CallContext) {
    return this.unary('UpdateRollout', ctx, {}, (r) => r.updateRollout(request));
  }

  startAutoRollout(request: StartAutoRolloutRequest, ctx: CallContext) {
    return this.unary('StartAutoRollout', ctx, {}, (r) => r.startAutoRollout(request));
  }

  /**
   * Routers report their traffic straight to the registry; the gateway has no such method. The
   * generated service names it, so it must have a handler here: it answers what grpc-js answers for a
   * method a server does not serve, UNIMPLEMENTED, with or without a key (there is nothing to
   * authorize), and the registry never hears of it.
   */
  async reportTraffic(_request: unknown, _ctx: CallContext): Promise<never> {
    this.metrics.startRequest('grpc').end('ReportTraffic', 'UNIMPLEMENTED');
    throw Errors.notImplemented(
      'ReportTraffic is reported by routers only, straight to the registry; the gateway does not serve it',
    );
  }

  setCachePolicy(request: SetCachePolicyRequest, ctx: CallContext) {
    return this.unary('SetCachePolicy', ctx, {}, (r) => r.setCachePolicy(request));
  }

  updateModel(request: UpdateModelRequest, ctx: CallContext) {
    return this.unary('UpdateModel', ctx, {}, (r) => r.updateModel(request));
  }

  retireModelVersion(request: RetireModelVersionRequest, ctx: CallContext) {
    return this.unary('RetireModelVersion', ctx, {}, (r) => r.retireModelVersion(request));
  }

  deleteModel(request: DeleteModelRequest, ctx: CallContext) {
    return this.unary('DeleteModel', ctx, {}, (r) => r.deleteModel(request));
  }

  quantizeModelVersion(request: QuantizeModelVersionRequest, ctx: CallContext) {
    return this.unary('QuantizeModelVersion', ctx, {}, (r) => r.quantizeModelVersion(request));
  }

  watchModels(request: WatchModelsRequest, ctx: CallContext) {
    return this.serverStream('WatchModels', ctx, (r) => r.watchModels(request));
  }

  /** Authorizes, then forwards a call with one answer inside the call's context, and records its duration. */
  private async unary<T>(
    rpc: string,
    ctx: CallContext,
    options: { streaming?: boolean },
    call: (registry: Registry) => Promise<T>,
  ): Promise<T> {
    const timer = this.metrics.startRequest('grpc');
    let code = status.OK;
    try {
      await this.auth.authorize(ctx.metadata['authorization'], Scope.ADMIN);
      const deadlineMs =
        ctx.deadlineMs ?? (options.streaming === true ? undefined : this.clock.now() + this.config.defaultTimeoutMs);
      // The call's span goes with it: the registry's span of the control call is its child.
      const span = requestContext.current()?.span;
      return await requestContext.run(
        { requestId: ctx.requestId, deadlineMs, signal: ctx.signal, ...(span !== undefined && { span }) },
        () => this.registry.forward(call),
      );
    } catch (error) {
      code = toRpcError(error).code;
      throw error;
    } finally {
      timer.end(rpc, status[code] ?? String(code));
    }
  }

  /** Authorizes, then passes on the messages of a server-streaming call as they come, and records its duration. */
  private async *serverStream<T>(
    rpc: string,
    ctx: CallContext,
    call: (registry: Registry) => AsyncIterable<T>,
  ): AsyncGenerator<T> {
    const timer = this.metrics.startRequest('grpc');
    let code = status.OK;
    try {
      await this.auth.authorize(ctx.metadata['authorization'], Scope.ADMIN);
      // The server runs this generator inside the call's context: its id, the caller's deadline, its cancellation.
      yield* this.registry.forwardStream(call);
    } catch (error) {
      code = toRpcError(error).code;
      throw error;
    } finally {
      timer.end(rpc, status[code] ?? String(code));
    }
  }
}
