import { clone, create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromMs, timestampNow } from '@bufbuild/protobuf/wkt';
import { status } from '@grpc/grpc-js';
import { type CallContext, GrpcServer, RpcError, type ServiceImpl } from '@infermesh/grpc';
import {
  AutoRolloutPhase,
  AutoRolloutSchema,
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  RegistryService,
  type QuantizeModelVersionRequest,
  RolloutDecision,
  RolloutEventSchema,
  RolloutPolicySchema,
  VersionState,
  type WatchModelsRequest,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { modelIdOf, modelNameOf, stableVersion, versionIdOf } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { createHash } from 'node:crypto';
import { FakeApiKeys } from './fake-api-keys';

type Impl = ServiceImpl<typeof RegistryService>;

/** A call the registry received: the method, the request as decoded, and its authorization header. */
export interface RecordedCall {
  method: string;
  request: unknown;
  authorization: string | undefined;
}

/** The phase an automatic rollout is in after a decision. */
const PHASE_AFTER: Record<RolloutDecision, AutoRolloutPhase> = {
  [RolloutDecision.UNSPECIFIED]: AutoRolloutPhase.UNSPECIFIED,
  [RolloutDecision.STARTED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.ADVANCED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.RESUMED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.PAUSED]: AutoRolloutPhase.PAUSED,
  [RolloutDecision.PROMOTED]: AutoRolloutPhase.PROMOTED,
  [RolloutDecision.ROLLED_BACK]: AutoRolloutPhase.ROLLED_BACK,
  [RolloutDecision.ABORTED]: AutoRolloutPhase.ABORTED,
};

/** What a decision of the registry's automatic rollout says besides itself. */
export interface FakeDecision {
  reason?: string;
  figures?: MessageInitShape<typeof RolloutEventSchema>['figures'];
  /** Epoch milliseconds; default now. */
  atMs?: number;
}

/** An upload as it arrived: the size of each chunk and the expected_sha256 values sent with it. */
export interface RecordedUpload {
  chunkSizes: number[];
  expectedSha256: string[];
}

const unimplemented = (method: string) => new RpcError(status.UNIMPLEMENTED, `${method} is not used by the CLI`);

/**
 * The registry behind the gateway's admin API, as the CLI's specs see it (the registry is outside the
 * CLI): models in memory, uploads hashed and kept, every call recorded with its authorization header,
 * and a WatchModels that sends a snapshot and then every change. Only callers presenting
 * `Bearer <apiKey>` are served. Versions change state only when a spec says so (setVersionState), as a
 * worker would report it; afterSnapshot runs once a watch has sent its first message.
 */
export class FakeRegistry implements Impl {
  readonly calls: RecordedCall[] = [];
  readonly uploads: RecordedUpload[] = [];
  readonly artifacts = new Map<string, Uint8Array>();
  afterSnapshot: ((registry: FakeRegistry) => void) | undefined;
  /** Runs before GetModel answers: where a spec makes the registry's rollout decisions as a follower polls. */
  beforeGetModel: ((registry: FakeRegistry) => void) | undefined;
  /** What QuantizeModelVersion answers (the derivation is the registry's, outside the CLI); unset: UNIMPLEMENTED. */
  quantizeAnswer: ((request: QuantizeModelVersionRequest) => ModelVersion) | undefined;
  private readonly models = new Map<string, Model>();
  private readonly followers = new Set<(change: WatchModelsResponse) => void>();
  private revision = 0n;
  private rollouts = 0;

  constructor(private readonly apiKey: string) {}

  /** Adds a model as it would be stored. */
  seed(model: MessageInitShape<typeof ModelSchema>): Model {
    const stored = create(ModelSchema, model);
    this.models.set(stored.name, stored);
    this.changed(stored);
    return stored;
  }

  model(name: string): Model | undefined {
    return this.models.get(name);
  }

  /** What a worker reports: the version (models/m/versions/v) is now in `state`. */
  setVersionState(versionName: string, state: VersionState, reason = '', warmUpError = ''): void {
    const model = this.models.get(modelNameOf(versionName));
    const version = model?.versions.find((v) => v.name === versionName);
    if (model === undefined || version === undefined) throw new Error(`no version ${versionName}`);
    version.state = state;
    version.stateReason = reason;
    version.warmUpError = warmUpError;
    this.changed(model);
  }

  /**
   * A decision of the model's automatic rollout, as the registry's analysis would make it: the
   * rollout's phase follows, ADVANCED moves it to the next step (its share becomes the canary's),
   * and the decision joins the model's history with the figures given.
   */
  decide(modelName: string, decision: RolloutDecision, details: FakeDecision = {}): void {
    const model = this.existing(modelName);
    const rollout = model.autoRollout;
    if (rollout === undefined) throw new Error(`${modelName} has no automatic rollout`);
    const at = timestampFromMs(details.atMs ?? Date.now());
    if (decision === RolloutDecision.ADVANCED) {
      rollout.step += 1;
      rollout.stepStartTime = at;
      if (model.rollout?.canary !== undefined)
        model.rollout.canary.percent = rollout.analysis?.steps[rollout.step] ?? 100;
    }
    rollout.phase = PHASE_AFTER[decision];
    rollout.reason = details.reason ?? '';
    rollout.updateTime = at;
    const event = create(RolloutEventSchema, {
      time: at,
      rolloutId: rollout.id,
      version: rollout.canaryVersion,
      decision,
      step: rollout.step,
      percent: rollout.analysis?.steps[rollout.step] ?? 0,
      reason: rollout.reason,
      ...(details.figures !== undefined && { figures: details.figures }),
    });
    if (event.figures !== undefined) rollout.figures = event.figures;
    // The trial ends: the canary takes everything, or nothing and is marked with the reason.
    if (decision === RolloutDecision.PROMOTED)
      model.rollout = create(RolloutPolicySchema, { stableVersion: rollout.canaryVersion });
    if (decision === RolloutDecision.ROLLED_BACK) {
      model.rollout = create(RolloutPolicySchema, { stableVersion: rollout.stableVersion });
      const canary = model.versions.find((v) => versionIdOf(v.name) === rollout.canaryVersion);
      if (canary !== undefined) canary.rollbackReason = rollout.reason;
    }
    model.rolloutHistory.push(event);
    this.changed(model);
  }

  /** The requests of one method, in order. */
  requests<T>(method: keyof Impl): T[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.request as T);
  }

  uploadArtifact: Impl['uploadArtifact'] = async (requests, ctx) => {
    this.admit('uploadArtifact', {}, ctx);
    const upload: RecordedUpload = { chunkSizes: [], expectedSha256: [] };
    const parts: Uint8Array[] = [];
    for await (const request of requests) {
      if (request.chunk.byteLength > 0) {
        upload.chunkSizes.push(request.chunk.byteLength);
        parts.push(request.chunk);
      }
      if (request.expectedSha256 !== '') upload.expectedSha256.push(request.expectedSha256);
    }
    this.uploads.push(upload);
    const bytes = Buffer.concat(parts);
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    const expected = upload.expectedSha256[upload.expectedSha256.length - 1];
    if (expected !== undefined && expected !== sha256) {
      throw RpcError.invalidArgument(
        `the uploaded bytes hash to ${sha256}, not the expected_sha256 ${expected}`,
        'INVALID_ARTIFACT',
      );
    }
    this.artifacts.set(sha256, bytes);
    return { artifact: { sha256, sizeBytes: BigInt(bytes.byteLength), format: 'onnx' } };
  };

  quantizeModelVersion: Impl['quantizeModelVersion'] = async (request, ctx) => {
    this.admit('quantizeModelVersion', request, ctx);
    if (this.quantizeAnswer === undefined)
      throw new RpcError(status.UNIMPLEMENTED, 'QuantizeModelVersion is not scripted in this spec');
    return { version: this.quantizeAnswer(request) };
  };

  createModelVersion: Impl['createModelVersion'] = async (request, ctx) => {
    this.admit('createModelVersion', request, ctx);
    const artifact = this.artifacts.get(request.artifactSha256);
    if (artifact === undefined) throw RpcError.notFound(`no artifact ${request.artifactSha256}`, 'ARTIFACT_NOT_FOUND');
    const model =
      this.models.get(request.parent) ?? create(ModelSchema, { name: request.parent, platform: 'onnxruntime_onnx' });
    const name = `${request.parent}/versions/${request.versionId}`;
    if (model.versions.some((v) => v.name === name))
      throw new RpcError(status.ALREADY_EXISTS, `${name} exists`, { reason: 'ALREADY_EXISTS' });
    model.versions.push(
      create(ModelVersionSchema, {
        name,
        state: VersionState.REGISTERED,
        artifact: { sha256: request.artifactSha256, sizeBytes: BigInt(artifact.byteLength), format: 'onnx' },
        signature: { maxBatchSize: request.maxBatchSize ?? 0 },
        createTime: timestampNow(),
      }),
    );
    this.models.set(model.name, model);
    this.changed(model);
    return { version: model.versions[model.versions.length - 1]! };
  };

  getModel: Impl['getModel'] = async (request, ctx) => {
    this.admit('getModel', request, ctx);
    this.beforeGetModel?.(this);
    return { model: this.existing(request.name) };
  };

  listModels: Impl['listModels'] = async (request, ctx) => {
    this.admit('listModels', request, ctx);
    return { models: [...this.models.values()] };
  };

  updateModel: Impl['updateModel'] = async (request, ctx) => {
    this.admit('updateModel', request, ctx);
    const given = request.model ?? create(ModelSchema);
    const model = this.existing(given.name);
    for (const path of request.updateMask?.paths ?? []) {
      switch (path) {
        case 'labels':
          model.labels = { ...given.labels };
          break;
        case 'pinned':
          model.pinned = given.pinned;
          break;
        case 'version_policy':
          model.versionPolicy = given.versionPolicy;
          break;
        case 'unloaded':
          model.unloaded = given.unloaded;
          break;
        default:
          throw RpcError.invalidArgument(`update_mask: "${path}" cannot be updated`);
      }
    }
    this.changed(model);
    return { model };
  };

  retireModelVersion: Impl['retireModelVersion'] = async (request, ctx) => {
    this.admit('retireModelVersion', request, ctx);
    const model = this.existing(modelNameOf(request.name));
    const version = model.versions.find((v) => v.name === request.name);
    if (version === undefined) throw RpcError.notFound(`no version ${request.name}`, 'VERSION_NOT_FOUND');
    version.state = version.state === VersionState.READY ? VersionState.DRAINING : VersionState.RETIRED;
    this.changed(model);
    return { version };
  };

  deleteModel: Impl['deleteModel'] = async (request, ctx) => {
    this.admit('deleteModel', request, ctx);
    this.existing(request.name);
    this.models.delete(request.name);
    this.notify({ revision: ++this.revision, deleted: [request.name] });
    return {};
  };

  setRolloutPolicy: Impl['setRolloutPolicy'] = async (request, ctx) => {
    this.admit('setRolloutPolicy', request, ctx);
    const model = this.existing(request.model);
    model.rollout = request.policy;
    this.changed(model);
    return { model };
  };

  updateRollout: Impl['updateRollout'] = async (request, ctx) => {
    this.admit('updateRollout', request, ctx);
    const model = this.existing(request.model);
    if (request.action.case === 'pause') {
      if (model.autoRollout?.phase !== AutoRolloutPhase.PROGRESSING) {
        throw new RpcError(
          status.FAILED_PRECONDITION,
          `model "${modelIdOf(model.name)}" has no automatic rollout in progress`,
        );
      }
      this.decide(model.name, RolloutDecision.PAUSED, { reason: 'paused by UpdateRollout' });
    }
    return { model };
  };

  /** Starts an automatic rollout at its first step (the version READY), or resumes a paused one; the steps after are the spec's to decide. */
  startAutoRollout: Impl['startAutoRollout'] = async (request, ctx) => {
    this.admit('startAutoRollout', request, ctx);
    const model = this.existing(request.model);
    const id = modelIdOf(model.name);
    if (request.resume) {
      if (model.autoRollout?.phase !== AutoRolloutPhase.PAUSED)
        throw new RpcError(status.FAILED_PRECONDITION, `model "${id}" has no paused automatic rollout`);
      this.decide(model.name, RolloutDecision.RESUMED, { reason: 'resumed by StartAutoRollout' });
      return { model };
    }
    const version = model.versions.find((v) => versionIdOf(v.name) === request.version);
    if (version?.state !== VersionState.READY)
      throw new RpcError(status.FAILED_PRECONDITION, `version ${request.version} of model "${id}" is not READY`);
    const stable = stableVersion(model);
    const now = timestampNow();
    model.autoRollout = create(AutoRolloutSchema, {
      id: `rollout-${++this.rollouts}`,
      canaryVersion: request.version,
      stableVersion: stable === undefined ? '' : versionIdOf(stable.name),
      ...(request.analysis !== undefined && { analysis: request.analysis }),
      phase: AutoRolloutPhase.PROGRESSING,
      startTime: now,
      stepStartTime: now,
    });
    model.rollout = create(RolloutPolicySchema, {
      stableVersion: model.autoRollout.stableVersion,
      canary: { version: request.version, percent: request.analysis?.steps[0] ?? 100 },
    });
    this.decide(model.name, RolloutDecision.STARTED, {
      reason: `waiting for ${request.analysis?.minRequests ?? 0n} canary requests`,
    });
    return { model };
  };

  async *watchModels(
    request: WatchModelsRequest,
    ctx: CallContext,
  ): AsyncGenerator<MessageInitShape<typeof WatchModelsResponseSchema>> {
    this.admit('watchModels', request, ctx);
    const queue: WatchModelsResponse[] = [];
    let wake: (() => void) | undefined;
    const follower = (change: WatchModelsResponse) => {
      queue.push(change);
      wake?.();
    };
    this.followers.add(follower);
    try {
      yield {
        revision: this.revision,
        models: [...this.models.values()].map((m) => clone(ModelSchema, m)),
        snapshot: true,
      };
      this.afterSnapshot?.(this);
      while (!ctx.signal.aborted) {
        if (queue.length === 0) {
          await new Promise<void>((resolve) => {
            wake = resolve;
            ctx.signal.addEventListener('abort', () => resolve(), { once: true });
          });
        }
        wake = undefined;
        while (queue.length > 0) yield queue.shift()!;
      }
    } finally {
      this.followers.delete(follower);
    }
  }

  downloadArtifact: Impl['downloadArtifact'] = () => {
    throw unimplemented('DownloadArtifact');
  };

  resolveModelVersion: Impl['resolveModelVersion'] = async () => {
    throw unimplemented('ResolveModelVersion');
  };

  reportVersionState: Impl['reportVersionState'] = async () => {
    throw unimplemented('ReportVersionState');
  };

  setCachePolicy: Impl['setCachePolicy'] = async () => {
    throw unimplemented('SetCachePolicy');
  };

  reportTraffic: Impl['reportTraffic'] = async () => {
    throw new RpcError(
      status.UNIMPLEMENTED,
      "ReportTraffic is the routers' own, sent straight to the registry; the CLI does not use it",
    );
  };

  private admit(method: string, request: unknown, ctx: CallContext): void {
    this.calls.push({ method, request, authorization: ctx.metadata['authorization'] });
    if (ctx.metadata['authorization'] !== `Bearer ${this.apiKey}`) {
      throw new RpcError(status.UNAUTHENTICATED, 'invalid API key', { reason: 'UNAUTHENTICATED' });
    }
  }

  private existing(name: string): Model {
    const model = this.models.get(name);
    if (model === undefined)
      throw RpcError.notFound(`model "${name.slice('models/'.length)}" not found`, 'MODEL_NOT_FOUND');
    return model;
  }

  private changed(model: Model): void {
    model.revision = ++this.revision;
    this.notify({ revision: this.revision, models: [clone(ModelSchema, model)] });
  }

  private notify(change: MessageInitShape<typeof WatchModelsResponseSchema>): void {
    const message = create(WatchModelsResponseSchema, change);
    for (const follower of this.followers) follower(message);
  }
}

export interface RunningFakeRegistry {
  registry: FakeRegistry;
  /** The gateway's own ApiKeyService, on the same port, as on a gateway. */
  apiKeys: FakeApiKeys;
  /** host:port of its gRPC server. */
  address: string;
  stop(): Promise<void>;
}

/** Serves a FakeRegistry and FakeApiKeys on a free loopback port: the gateway's admin API. */
export async function startFakeRegistry(apiKey: string): Promise<RunningFakeRegistry> {
  const registry = new FakeRegistry(apiKey);
  const apiKeys = new FakeApiKeys(apiKey);
  const server = new GrpcServer({
    logger: new JsonLogger('fake-registry', 'error', () => undefined),
    metrics: new Metrics('fake_registry'),
    maxMessageBytes: 8 * 1024 * 1024,
  });
  server.add(RegistryService, registry);
  server.add(ApiKeyService, apiKeys);
  const port = await server.listen('127.0.0.1', 0);
  return { registry, apiKeys, address: `127.0.0.1:${port}`, stop: () => server.shutdown(1_000) };
}
