import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { RpcError, toRpcError } from '@infermesh/grpc';
import { requestContext } from '@infermesh/telemetry';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';
import { GatewayMetrics } from './gateway-metrics';
import { RouterClient } from './router.client';

/**
 * Runs one inference through the router and counts its outcome. At most GATEWAY_MAX_IN_FLIGHT run at
 * once: past that the system is behind, and a request is refused at once (RESOURCE_EXHAUSTED,
 * OVERLOADED, retry in a second) instead of waiting in this process's memory behind the others.
 */
@Injectable()
export class ModelInference {
  private inFlight = 0;

  constructor(
    private readonly router: RouterClient,
    private readonly metrics: GatewayMetrics,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
  ) {}

  async infer(request: InferenceRequest, signal?: AbortSignal): Promise<InferenceResponse> {
    if (this.inFlight >= this.config.maxInFlight) {
      this.metrics.countInference('(not routed)', '', 'overloaded');
      throw new RpcError(
        status.RESOURCE_EXHAUSTED,
        `the gateway is at its limit of ${this.config.maxInFlight} inference requests in flight (GATEWAY_MAX_IN_FLIGHT); retry later`,
        { reason: 'OVERLOADED', retryDelayMs: 1_000 },
      );
    }
    this.inFlight += 1;
    // The request's span says what was asked and by which tenant (never the key), then what answered.
    const span = requestContext.current()?.span;
    span?.setAttributes({ 'infermesh.model': request.modelName, 'infermesh.tenant': request.tenant, 'infermesh.request_id': requestContext.current()!.requestId });
    try {
      const response = await this.router.infer(request, signal);
      const outcome = response.degraded ? 'degraded' : response.cached ? 'cached' : 'ok';
      span?.setAttributes({ 'infermesh.model.version': response.modelVersion, 'infermesh.cached': response.cached, 'infermesh.degraded': response.degraded });
      this.metrics.countInference(response.modelName, response.modelVersion, outcome);
      return response;
    } catch (error) {
      const code = toRpcError(error).code;
      // An unknown model name is the client's free text: it must not become a label value.
      const model = code === status.NOT_FOUND ? '(unknown)' : request.modelName;
      this.metrics.countInference(model, request.modelVersion, (status[code] ?? String(code)).toLowerCase());
      throw error;
    } finally {
      this.inFlight -= 1;
    }
  }
}
