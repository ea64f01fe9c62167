import { Injectable } from '@nestjs/common';
import { type CallContext, type ServiceImpl, Errors } from '@infermesh/grpc';
import type { BatcherService, InferRequest } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { Scheduler } from './scheduler';

/** gRPC transport of the batcher. */
@Injectable()
export class BatcherGrpcController implements Omit<ServiceImpl<typeof BatcherService>, 'infers'> {
  constructor(private readonly scheduler: Scheduler) {}

  async infer(request: InferRequest, ctx: CallContext) {
    if (request.request === undefined) throw Errors.invalidRequest('the call carries no request');
    return { response: await this.scheduler.enqueue(request.request, ctx) };
  }
}
