import { Injectable } from '@nestjs/common';
import type { CallContext, ServiceImpl } from '@infermesh/grpc';
import type {
  CreateModelVersionRequest,
  DeleteModelRequest,
  DownloadArtifactRequest,
  GetModelRequest,
  QuantizeModelVersionRequest,
  RegistryService,
  ReportTrafficRequest,
  ReportVersionStateRequest,
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
import { ArtifactTransfer } from './artifact-transfer';
import { AutoRollouts } from './auto-rollouts';
import { ModelCatalog } from './model-catalog';
import { ModelDerivation } from './model-derivation';
import { ModelWatch } from './model-watch';
import { TrafficLedger, trafficDeltas } from './traffic-ledger';

/** gRPC transport of the registry service. */
@Injectable()
export class RegistryGrpcController implements ServiceImpl<typeof RegistryService> {
  constructor(
    private readonly catalog: ModelCatalog,
    private readonly transfer: ArtifactTransfer,
    private readonly watch: ModelWatch,
    private readonly derivation: ModelDerivation,
    private readonly rollouts: AutoRollouts,
    private readonly traffic: TrafficLedger,
  ) {}

  async uploadArtifact(requests: AsyncIterable<UploadArtifactRequest>, ctx: CallContext) {
    return { artifact: await this.transfer.upload(requests, ctx.signal) };
  }

  async *downloadArtifact(request: DownloadArtifactRequest) {
    for await (const chunk of this.transfer.download(request.sha256)) yield { chunk };
  }

  async createModelVersion(request: CreateModelVersionRequest) {
    return { version: await this.catalog.createVersion(request) };
  }

  async getModel(request: GetModelRequest) {
    return { model: await this.catalog.getModel(request.name) };
  }

  async listModels() {
    return { models: await this.catalog.listModels() };
  }

  async resolveModelVersion(request: ResolveModelVersionRequest) {
    return { version: await this.catalog.resolve(request.model, request.versionId) };
  }

  async reportVersionState(request: ReportVersionStateRequest) {
    return {
      version: await this.catalog.reportState(
        request.name,
        request.state,
        request.stateReason,
        request.workerId,
        request.warmUpError,
      ),
    };
  }

  async setRolloutPolicy(request: SetRolloutPolicyRequest) {
    return { model: await this.catalog.setRollout(request.model, request.policy) };
  }

  async setCachePolicy(request: SetCachePolicyRequest) {
    return { model: await this.catalog.setCachePolicy(request.model, request.policy) };
  }

  async updateRollout(request: UpdateRolloutRequest) {
    return { model: await this.catalog.updateRollout(request.model, request.action) };
  }

  async updateModel(request: UpdateModelRequest) {
    return { model: await this.catalog.updateModel(request.model, request.updateMask?.paths ?? []) };
  }

  async retireModelVersion(request: RetireModelVersionRequest) {
    return { version: await this.catalog.retireVersion(request.name) };
  }

  async deleteModel(request: DeleteModelRequest) {
    await this.catalog.deleteModel(request.name);
    return {};
  }

  async quantizeModelVersion(request: QuantizeModelVersionRequest, ctx: CallContext) {
    return { version: await this.derivation.quantize(request, ctx.signal) };
  }

  async startAutoRollout(request: StartAutoRolloutRequest) {
    return { model: await this.rollouts.start(request) };
  }

  async reportTraffic(request: ReportTrafficRequest) {
    await this.traffic.add(trafficDeltas(request));
    return {};
  }

  watchModels(request: WatchModelsRequest, ctx: CallContext) {
    return this.watch.watch(request.fromRevision, ctx.signal);
  }
}
