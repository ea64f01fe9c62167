import { type INestApplicationContext, Inject, Injectable } from '@nestjs/common';
import { create } from '@bufbuild/protobuf';
import { type CallContext, type ServiceImpl, Errors } from '@infermesh/grpc';
import {
  type InferRequest,
  type LoadedModel,
  LoadedModelSchema,
  type LoadModelRequest,
  type UnloadModelRequest,
  WorkerService,
} from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { bind, type GrpcBinding } from '@infermesh/runtime';
import { splitVersionName } from '@infermesh/rollout';
import { InferenceExecutor } from './inference-executor';
import { ModelLifecycle } from './model-lifecycle';
import { assertPlaced } from './model-placement';
import { ModelSync } from './model-sync';
import { ModelTable, type WorkerModel } from './model-table';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** gRPC transport of the worker; Infers carries Infer's calls (GrpcServer.add). */
@Injectable()
export class WorkerGrpcController implements Omit<ServiceImpl<typeof WorkerService>, 'infers'> {
  constructor(
    private readonly executor: InferenceExecutor,
    private readonly table: ModelTable,
    private readonly lifecycle: ModelLifecycle,
    private readonly sync: ModelSync,
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
  ) {}

  async infer(request: InferRequest, ctx: CallContext) {
    if (request.request === undefined) throw Errors.invalidRequest('infer needs a request');
    return { response: await this.executor.infer(request.request, ctx.deadlineMs) };
  }

  async listModels() {
    return {
      workerId: this.config.workerId,
      models: this.table.list().map(describe),
      memoryBudgetBytes: BigInt(this.config.memoryBudgetBytes),
      memoryUsedBytes: BigInt(this.table.usedBytes),
      placedModels: [...this.config.placedModels],
    };
  }

  async loadModel(request: LoadModelRequest) {
    const entry = await this.find(request.name);
    if (request.pin) entry.pinned = true;
    await this.lifecycle.ensureLoaded(entry);
    return { model: describe(entry) };
  }

  async unloadModel(request: UnloadModelRequest) {
    const entry = await this.find(request.name);
    entry.pinned = false;
    await this.lifecycle.unload(entry, 'requested');
    return {};
  }

  private async find(name: string): Promise<WorkerModel> {
    const ids = splitVersionName(name);
    if (ids === undefined) {
      throw Errors.invalidRequest(`"${name}" is not a model version name; expected models/{model}/versions/{version}`);
    }
    assertPlaced(this.config, ids.modelId, ids.versionId);
    const entry = this.table.get(name) ?? (await this.sync.lookup(name));
    if (entry === undefined) throw Errors.modelNotFound(`${name} is not registered for this worker`);
    return entry;
  }
}

/** The worker's gRPC service as it is hosted: Infers carries Infer's calls, one stream per batcher. */
export function workerBinding(app: INestApplicationContext): GrpcBinding {
  return bind(WorkerService, app.get(WorkerGrpcController), { infers: 'infer' });
}

function describe(entry: WorkerModel): LoadedModel {
  return create(LoadedModelSchema, {
    name: entry.name,
    state: entry.state,
    stateReason: entry.reason,
    executionProvider: entry.executionProvider,
    memoryBytes: BigInt(entry.memoryBytes),
    pinned: entry.pinned,
    instances: entry.session?.instanceCount ?? 0,
    warmUpError: entry.warmUpError,
  });
}
