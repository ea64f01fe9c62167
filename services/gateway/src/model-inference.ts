import { status } from '@grpc/grpc-js';
import { Injectable } from '@nestjs/common';
import { toRpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { GatewayMetrics } from './gateway-metrics';
import { RouterClient } from './router.client';

/** Runs one inference through the router and counts its outcome. */
@Injectable()
export class ModelInference {
  constructor(
    private readonly router: RouterClient,
    private readonly metrics: GatewayMetrics,
  ) {}

  async infer(request: InferenceRequest, signal?: AbortSignal): Promise<InferenceResponse> {
    try {
      const response = await this.router.infer(request, signal);
      const outcome = response.degraded ? 'degraded' : response.cached ? 'cached' : 'ok';
      this.metrics.countInference(response.modelName, response.modelVersion, outcome);
      return response;
    } catch (error) {
      const code = toRpcError(error).code;
      // An unknown model name is the client's free text: it must not become a label value.
      const model = code === status.NOT_FOUND ? '(unknown)' : request.modelName;
      this.metrics.countInference(model, request.modelVersion, (status[code] ?? String(code)).toLowerCase());
      throw error;
    }
  }
}
