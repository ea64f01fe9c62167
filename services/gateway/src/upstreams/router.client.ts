import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { createClient, type ServiceClient, Errors } from '@infermesh/grpc';
import { type JsonLogger } from '@infermesh/telemetry';
import { upstreamError } from './upstream-errors';

/** The gateway's port to the router: one inference call. */
export class RouterClient {
  private readonly client: ServiceClient<typeof RouterService>;

  /** `carried`: calls go as messages on one stream (RouterService/Infers), not each a call of its own. */
  constructor(
    address: string,
    maxMessageBytes: number,
    private readonly logger: JsonLogger,
    carried = false,
  ) {
    this.client = createClient(RouterService, address, {
      maxMessageBytes,
      ...(carried && { carried: { infer: 'infers' } }),
    });
  }

  /** Forwards a request; the ambient request context supplies the id and the deadline. */
  async infer(request: InferenceRequest, signal?: AbortSignal): Promise<InferenceResponse> {
    let response;
    try {
      response = await this.client.infer({ request }, signal === undefined ? {} : { signal });
    } catch (error) {
      throw upstreamError('router', error, this.logger);
    }
    if (response.response === undefined) {
      this.logger.error('router answered without a response');
      throw Errors.internal('the router answered without a response');
    }
    return response.response;
  }

  close(): void {
    this.client.close();
  }
}
