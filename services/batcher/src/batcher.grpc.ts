import { Injectable } from '@nestjs/common';
import { RpcError, type ServiceImpl } from '@infermesh/grpc';
import type { BatcherService, InferRequest } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { Dispatcher } from './dispatcher';

/** gRPC transport of the batcher. */
@Injectable()
export class BatcherGrpcController implements ServiceImpl<typeof BatcherService> {
  constructor(private readonly dispatcher: Dispatcher) {}

  async infer(request: InferRequest) {
    if (request.request === undefined) throw RpcError.invalidArgument('the call carries no request');
    return { response: await this.dispatcher.infer(request.request) };
  }
}
