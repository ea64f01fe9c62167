import { Inject, Injectable } from '@nestjs/common';
import { type CallContext, RpcError, type ServiceImpl } from '@infermesh/grpc';
import type { InferRequest, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { InferenceExecutor } from './inference-executor';
import { ModelTable } from './model-table';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** gRPC transport of the worker. */
@Injectable()
export class WorkerGrpcController implements ServiceImpl<typeof WorkerService> {
  constructor(
    private readonly executor: InferenceExecutor,
    private readonly table: ModelTable,
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
  ) {}

  async infer(request: InferRequest, ctx: CallContext) {
    if (request.request === undefined) throw RpcError.invalidArgument('infer needs a request');
    return { response: await this.executor.infer(request.request, ctx.deadlineMs) };
  }

  async listModels() {
    return {
      workerId: this.config.workerId,
      models: this.table.list().map((m) => ({
        name: m.name,
        state: m.state,
        stateReason: m.reason,
        executionProvider: m.executionProvider,
      })),
    };
  }
}
