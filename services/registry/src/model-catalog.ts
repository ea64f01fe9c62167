import { create, equals, toJsonString } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import { status } from '@grpc/grpc-js';
import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { RpcError } from '@infermesh/grpc';
import {
  type CachePolicy,
  CachePolicySchema,
  type CreateModelVersionRequest,
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  type RolloutPolicy,
  RolloutPolicySchema,
  type UpdateRolloutRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { compareVersionIds, stableVersion, versionIdOf } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { Gauge } from 'prom-client';
import { ArtifactStore, SHA256_HEX } from './artifact-store';
import { checkBatching, sameBatching } from './batching-check';
import { Clock } from './clock';
import { ModelStore } from './model-store';
import { maxBatchSizeFor, readOnnxSignature } from './onnx-signature';
import { checkProcessing, sameProcessing } from './processing-check';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';
import { checkVersionId, modelName, parseModelName, parseVersionName, versionName } from './resource-names';
import { applyRolloutAction } from './rollout-actions';
import { checkRollout } from './rollout-check';

export const ONNX_PLATFORM = 'onnxruntime_onnx';

/** The longest a model's cached results may live. */
const MAX_CACHE_TTL_MS = 7n * 24n * 3_600_000n;

/** The states a worker may report for a version it loads. */
const REPORTABLE_STATES = new Set([VersionState.LOADING, VersionState.READY, VersionState.FAILED]);

/** "READY" for VersionState.READY. */
export function stateName(state: VersionState): string {
  return (VersionState[state] ?? String(state)).replace(/^VERSION_STATE_/, '');
}

/**
 * The registry's use cases on models and versions: register a version from an uploaded artifact,
 * read models, resolve the version that serves a request, and record the states workers report.
 */
@Injectable()
export class ModelCatalog implements OnApplicationShutdown {
  constructor(
    private readonly models: ModelStore,
    private readonly artifacts: ArtifactStore,
    private readonly clock: Clock,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    registerGauges(metrics, models, logger);
  }

  /**
   * Registers a version, creating its model when missing, with its processing and batching checked
   * against the signature. Registering the same version with the same artifact (and processing and
   * batching) again returns the existing version; with a different one it is ALREADY_EXISTS.
   */
  async createVersion(request: CreateModelVersionRequest): Promise<ModelVersion> {
    const modelId = parseModelName(request.parent, 'parent');
    const versionId = checkVersionId(request.versionId);
    const sha256 = request.artifactSha256.toLowerCase();
    if (!SHA256_HEX.test(sha256)) {
      throw RpcError.invalidArgument(`artifact_sha256 must be 64 hexadecimal digits, got "${request.artifactSha256}"`);
    }
    const name = versionName(modelId, versionId);
    const existing = findVersion(await this.store(() => this.models.get(modelId)), versionId);
    if (existing !== undefined) return checkSameVersion(existing, sha256, request);

    const bytes = await this.artifacts.readAll(sha256);
    if (bytes === undefined) {
      throw RpcError.notFound(`artifact ${sha256} is not in the registry; upload it with UploadArtifact first`, 'ARTIFACT_NOT_FOUND', {
        sha256,
      });
    }
    const signature = readOnnxSignature(bytes);
    const now = timestampFromDate(this.clock.now());
    const version = create(ModelVersionSchema, {
      name,
      state: VersionState.REGISTERED,
      signature: {
        inputs: signature.inputs,
        outputs: signature.outputs,
        maxBatchSize: maxBatchSizeFor(signature, this.config.defaultMaxBatchSize, request.maxBatchSize),
      },
      artifact: { sha256, sizeBytes: BigInt(bytes.length), format: 'onnx' },
      createTime: now,
      updateTime: now,
    });
    version.processing = checkProcessing(request.processing, version.signature!);
    version.batching = checkBatching(request.batching, version.signature!);
    let created = false;
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        created = false;
        const model = current ?? create(ModelSchema, { name: modelName(modelId), platform: ONNX_PLATFORM });
        const raced = findVersion(model, versionId);
        if (raced !== undefined) {
          checkSameVersion(raced, sha256, request);
          return undefined;
        }
        model.versions.push(version);
        model.versions.sort((a, b) => compareVersionIds(versionIdOf(a.name), versionIdOf(b.name)));
        created = true;
        return model;
      }),
    );
    if (created) {
      this.logger.info('model version registered', { version: name, artifact: sha256, max_batch_size: version.signature?.maxBatchSize });
    }
    return findVersion(stored, versionId)!;
  }

  async getModel(name: string): Promise<Model> {
    const modelId = parseModelName(name, 'name');
    return this.existingModel(modelId);
  }

  /** Every model, ordered by name, each with its versions ordered by version number. */
  async listModels(): Promise<Model[]> {
    return this.store(() => this.models.list());
  }

  /**
   * The version that serves a request: the given version when it is READY, or without a version id
   * the model's stable version (its rollout's, when READY, else the highest-numbered READY one). A version that exists but is not READY is UNAVAILABLE with
   * MODEL_NOT_READY, so that callers may retry once it has loaded.
   */
  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    const modelId = parseModelName(model, 'model');
    if (versionId !== '') checkVersionId(versionId);
    const found = await this.existingModel(modelId);
    if (versionId !== '') {
      const version = findVersion(found, versionId);
      if (version === undefined) {
        throw RpcError.notFound(`model "${modelId}" has no version ${versionId}`, 'VERSION_NOT_FOUND', { model: modelId, version: versionId });
      }
      if (version.state !== VersionState.READY) {
        throw new RpcError(status.UNAVAILABLE, `version ${versionId} of model "${modelId}" is ${stateName(version.state)}, not READY`, {
          reason: 'MODEL_NOT_READY',
          metadata: { model: modelId, version: versionId, state: stateName(version.state) },
        });
      }
      return version;
    }
    const stable = stableVersion(found);
    if (stable === undefined) {
      throw new RpcError(status.UNAVAILABLE, `model "${modelId}" has no READY version`, {
        reason: 'MODEL_NOT_READY',
        metadata: { model: modelId },
      });
    }
    return stable;
  }

  /** Changes a model's rollout in one step: promote, roll back or set shares; the result is checked like any policy. */
  async updateRollout(model: string, action: UpdateRolloutRequest['action']): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        if (current === undefined) throw RpcError.notFound(`model "${modelId}" not found`, 'MODEL_NOT_FOUND', { model: modelId });
        current.rollout = checkRollout(applyRolloutAction(current, action), current);
        return current;
      }),
    );
    this.logger.info('rollout updated', { model: modelId, action: action.case ?? 'none', rollout: stored?.rollout === undefined ? 'none' : toJsonString(RolloutPolicySchema, stored.rollout) });
    return stored!;
  }

  /** Replaces how the router caches a model's results; an empty policy clears it. */
  async setCachePolicy(model: string, policy: CachePolicy | undefined): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    if (policy !== undefined) {
      if (policy.ttlMs < 0n || policy.ttlMs > MAX_CACHE_TTL_MS) {
        throw RpcError.invalidArgument(`cache: ttl_ms is ${policy.ttlMs}; it must be from 0 (the router's default) to ${MAX_CACHE_TTL_MS} (7 days)`);
      }
      if (policy.maxEntryBytes < 0n) throw RpcError.invalidArgument(`cache: max_entry_bytes is ${policy.maxEntryBytes}; it cannot be negative`);
    }
    const empty = policy === undefined || equals(CachePolicySchema, policy, create(CachePolicySchema));
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        if (current === undefined) throw RpcError.notFound(`model "${modelId}" not found`, 'MODEL_NOT_FOUND', { model: modelId });
        current.cache = empty ? undefined : policy;
        return current;
      }),
    );
    this.logger.info('cache policy set', { model: modelId, cache: stored?.cache === undefined ? 'defaults' : toJsonString(CachePolicySchema, stored.cache) });
    return stored!;
  }

  /** Replaces a model's rollout policy, checked against its versions; an empty one clears it. */
  async setRollout(model: string, policy: RolloutPolicy | undefined): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    const fallback = policy?.fallbackModel ?? '';
    if (fallback === modelId) throw RpcError.invalidArgument(`rollout: model "${modelId}" cannot be its own fallback`);
    if (fallback !== '' && (await this.store(() => this.models.get(fallback))) === undefined) {
      throw RpcError.invalidArgument(`rollout: the fallback model "${fallback}" does not exist`);
    }
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        if (current === undefined) throw RpcError.notFound(`model "${modelId}" not found`, 'MODEL_NOT_FOUND', { model: modelId });
        current.rollout = checkRollout(policy, current);
        return current;
      }),
    );
    this.logger.info('rollout policy set', { model: modelId, rollout: stored?.rollout === undefined ? 'none' : toJsonString(RolloutPolicySchema, stored.rollout) });
    return stored!;
  }

  /** Records the state a worker reports for a version: LOADING, READY, or FAILED with a reason. */
  async reportState(name: string, state: VersionState, reason: string, workerId: string): Promise<ModelVersion> {
    const { modelId, versionId } = parseVersionName(name, 'name');
    if (!REPORTABLE_STATES.has(state)) {
      throw RpcError.invalidArgument(`a worker may report LOADING, READY or FAILED, not ${stateName(state)}`);
    }
    const stateReason = state === VersionState.FAILED ? reason || 'failed (no reason given)' : '';
    const now = timestampFromDate(this.clock.now());
    let changed = false;
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        changed = false;
        const version = current === undefined ? undefined : findVersion(current, versionId);
        if (current === undefined) throw RpcError.notFound(`model "${modelId}" not found`, 'MODEL_NOT_FOUND', { model: modelId });
        if (version === undefined) {
          throw RpcError.notFound(`model "${modelId}" has no version ${versionId}`, 'VERSION_NOT_FOUND', { model: modelId, version: versionId });
        }
        if (version.state === state && version.stateReason === stateReason) return undefined;
        version.state = state;
        version.stateReason = stateReason;
        version.updateTime = now;
        changed = true;
        return current;
      }),
    );
    if (changed) {
      this.logger.info('model version state reported', { version: name, state: stateName(state), reason: stateReason, worker_id: workerId });
    }
    return findVersion(stored, versionId)!;
  }

  async onApplicationShutdown(): Promise<void> {
    await this.models.close();
  }

  private async existingModel(modelId: string): Promise<Model> {
    const model = await this.store(() => this.models.get(modelId));
    if (model === undefined) throw RpcError.notFound(`model "${modelId}" not found`, 'MODEL_NOT_FOUND', { model: modelId });
    return model;
  }

  /** Runs a store operation; a store failure (Redis unreachable...) is UNAVAILABLE, not INTERNAL. */
  private async store<T>(operation: () => Promise<T>): Promise<T> {
    try {
      return await operation();
    } catch (error) {
      if (error instanceof RpcError) throw error;
      this.logger.warn('model store operation failed', { err: error instanceof Error ? error.message : String(error) });
      throw RpcError.unavailable(`the registry's model store is unavailable: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}

function findVersion(model: Model | undefined, versionId: string): ModelVersion | undefined {
  return model?.versions.find((v) => versionIdOf(v.name) === versionId);
}

/** An existing version registered again: the same request is idempotent, a different one a conflict. */
function checkSameVersion(existing: ModelVersion, sha256: string, request: CreateModelVersionRequest): ModelVersion {
  const { maxBatchSize } = request;
  const existingSha = existing.artifact?.sha256 ?? '';
  if (existingSha !== sha256) {
    throw new RpcError(status.ALREADY_EXISTS, `${existing.name} already exists with artifact ${existingSha}; register the new artifact as a new version`, {
      reason: 'ALREADY_EXISTS',
      metadata: { version: existing.name, sha256: existingSha },
    });
  }
  const existingBatch = existing.signature?.maxBatchSize ?? 0;
  if (maxBatchSize !== undefined && maxBatchSize !== existingBatch) {
    throw new RpcError(status.ALREADY_EXISTS, `${existing.name} already exists with max_batch_size ${existingBatch}, not ${maxBatchSize}`, {
      reason: 'ALREADY_EXISTS',
      metadata: { version: existing.name },
    });
  }
  if (!sameProcessing(existing.processing, request.processing)) {
    throw new RpcError(status.ALREADY_EXISTS, `${existing.name} already exists with a different processing; register the new processing as a new version`, {
      reason: 'ALREADY_EXISTS',
      metadata: { version: existing.name },
    });
  }
  if (!sameBatching(existing.batching, request.batching)) {
    throw new RpcError(status.ALREADY_EXISTS, `${existing.name} already exists with a different batching; register the new batching as a new version`, {
      reason: 'ALREADY_EXISTS',
      metadata: { version: existing.name },
    });
  }
  return existing;
}

/**
 * Gauges of the models and versions in the store, read at scrape time so that they are right whichever
 * replica made the changes. One store read serves both gauges of a scrape.
 */
function registerGauges(metrics: Metrics, store: ModelStore, logger: JsonLogger): void {
  let last: Model[] = [];
  let pending: { at: number; models: Promise<Model[]> } | undefined;
  const snapshot = (): Promise<Model[]> => {
    if (pending === undefined || Date.now() - pending.at > 1_000) {
      pending = {
        at: Date.now(),
        models: store.list().then(
          (models) => (last = models),
          (error: unknown) => {
            logger.warn('model gauges: store unavailable, reporting the last values', { err: error instanceof Error ? error.message : String(error) });
            return last;
          },
        ),
      };
    }
    return pending.models;
  };
  new Gauge({
    name: `${metrics.prefix}models`,
    help: 'Models in the registry.',
    registers: [metrics.registry],
    async collect() {
      this.set((await snapshot()).length);
    },
  });
  new Gauge({
    name: `${metrics.prefix}model_versions`,
    help: 'Model versions in the registry, by state.',
    labelNames: ['state'],
    registers: [metrics.registry],
    async collect() {
      const counts = new Map<string, number>();
      for (const state of Object.values(VersionState)) {
        if (typeof state === 'number' && state !== VersionState.UNSPECIFIED) counts.set(stateName(state), 0);
      }
      for (const model of await snapshot()) {
        for (const version of model.versions) counts.set(stateName(version.state), (counts.get(stateName(version.state)) ?? 0) + 1);
      }
      for (const [state, count] of counts) this.set({ state }, count);
    },
  });
}
