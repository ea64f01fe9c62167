import { Injectable } from '@nestjs/common';
import { type ServiceImpl, Errors } from '@infermesh/grpc';
import type { InferRequest, RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { InferenceRouter } from './inference-router';

/** gRPC transport of the router. */
@Injectable()
export class RouterGrpcController implements Omit<ServiceImpl<typeof RouterService>, 'infers'> {
  constructor(private readonly router: InferenceRouter) {}

  async infer(request: InferRequest) {
    if (request.request === undefined) throw Errors.invalidRequest('the call carries no request');
    return { response: await this.router.infer(request.request) };
  }
}
