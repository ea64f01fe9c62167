import { create, equals, toJsonString } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  AutoRolloutPhase,
  type CachePolicy,
  CachePolicySchema,
  type CreateModelVersionRequest,
  type Lineage,
  type Model,
  ModelSchema,
  type ModelVersion,
  ModelVersionSchema,
  type RolloutPolicy,
  RolloutPolicySchema,
  type UpdateRolloutRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  checkVersionId,
  compareVersionIds,
  modelName,
  stableVersion,
  versionIdOf,
  versionName,
  phaseName,
} from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { Gauge } from 'prom-client';
import { ArtifactStore, SHA256_HEX } from './artifact-store';
import { pauseAutoRollout } from './auto-rollout';
import { checkBatching, sameBatching } from './batching-check';
import { checkExecution, sameExecution } from './execution-check';
import { Clock } from '@infermesh/clock';
import { ModelStore, type ModelMutation } from './model-store';
import { checkLabels, checkUpdateMask, checkVersionPolicy } from './model-update-check';
import { ModelWatch } from './model-watch';
import { maxBatchSizeFor, readOnnxSignature } from './onnx-signature';
import { checkProcessing, sameProcessing } from './processing-check';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';
import { parseModelName, parseVersionName } from './resource-name-check';
import { applyRolloutAction } from './rollout-actions';
import { checkRollout } from './rollout-check';
import { checkWarmUp, sameWarmUp } from './warm-up-check';
import {
  applyLifecycle,
  describeVersionPolicy,
  hasEnded,
  RETIRING_REASON,
  servingSet,
  stateName,
  type Transition,
  whyServing,
} from './version-lifecycle';

export const ONNX_PLATFORM = 'onnxruntime_onnx';

/** The longest warm_up_error a version records; a longer one is cut there. */
const MAX_WARM_UP_ERROR_CHARS = 2_000;

/** The longest a model's cached results may live. */
const MAX_CACHE_TTL_MS = 7n * 24n * 3_600_000n;

/** The states a worker may report for a version it loads. */
const REPORTABLE_STATES = new Set([VersionState.LOADING, VersionState.READY, VersionState.FAILED]);

/** The states of a version some worker has loaded, or is loading: its model cannot be deleted. */
const LOADED_STATES = new Set([VersionState.LOADING, VersionState.READY, VersionState.DRAINING]);

/**
 * The registry's use cases on models and versions: register a version from an uploaded artifact,
 * read models, resolve the version that serves a request, record the states workers report, change a
 * model's settings, retire versions and delete models. Every change also brings the model's version
 * states in line with its serving set (version-lifecycle.ts), and tells the watchers.
 */
@Injectable()
export class ModelCatalog implements OnApplicationShutdown {
  constructor(
    private readonly models: ModelStore,
    private readonly artifacts: ArtifactStore,
    private readonly clock: Clock,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    private readonly watch: ModelWatch,
    metrics: Metrics,
  ) {
    registerGauges(metrics, models, logger, clock);
  }

  /**
   * Registers a version, creating its model when missing, with its processing and batching checked
   * against the signature. Registering the same version with the same artifact (and processing and
   * batching) again returns the existing version; with a different one it is ALREADY_EXISTS. A version
   * the registry derived (model-derivation.ts) comes with its lineage.
   */
  async createVersion(request: CreateModelVersionRequest, lineage?: Lineage): Promise<ModelVersion> {
    const modelId = parseModelName(request.parent, 'parent');
    const versionId = checkVersionId(request.versionId);
    const sha256 = request.artifactSha256.toLowerCase();
    if (!SHA256_HEX.test(sha256)) {
      throw Errors.invalidRequest(`artifact_sha256 must be 64 hexadecimal digits, got "${request.artifactSha256}"`);
    }
    const name = versionName(modelId, versionId);
    const existing = findVersion(await this.store(() => this.models.get(modelId)), versionId);
    if (existing !== undefined) return checkSameVersion(existing, sha256, request);

    const bytes = await this.artifacts.readAll(sha256);
    if (bytes === undefined) {
      throw Errors.artifactNotFound(`artifact ${sha256} is not in the registry; upload it with UploadArtifact first`, {
        metadata: {
          sha256,
        },
      });
    }
    const signature = readOnnxSignature(bytes);
    const now = timestampFromDate(this.clock.date());
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
      lineage,
    });
    version.processing = checkProcessing(request.processing, version.signature!);
    version.batching = checkBatching(request.batching, version.signature!);
    version.warmUp = checkWarmUp(request.warmUp, version.signature!);
    version.execution = checkExecution(request.execution);
    let created = false;
    const stored = await this.mutate(modelId, (current) => {
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
    });
    if (created) {
      this.logger.info('model version registered', {
        version: name,
        artifact: sha256,
        max_batch_size: version.signature?.maxBatchSize,
      });
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
   * the model's stable version (its rollout's, when READY, else the highest-numbered READY one). A
   * version that exists but is not READY, or a model that is unloaded, is UNAVAILABLE with
   * MODEL_NOT_READY, so that callers may retry once it has loaded.
   */
  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    const modelId = parseModelName(model, 'model');
    if (versionId !== '') checkVersionId(versionId);
    const found = await this.existingModel(modelId);
    if (found.unloaded) {
      throw Errors.modelNotReady(
        `model "${modelId}" is unloaded; load it again with \`infermesh models load ${modelId}\` or POST /v2/repository/models/${modelId}/load`,
        { metadata: { model: modelId, unloaded: 'true' } },
      );
    }
    if (versionId !== '') {
      const version = findVersion(found, versionId);
      if (version === undefined) {
        throw Errors.versionNotFound(`model "${modelId}" has no version ${versionId}`, {
          metadata: {
            model: modelId,
            version: versionId,
          },
        });
      }
      if (version.state !== VersionState.READY) {
        throw Errors.modelNotReady(
          `version ${versionId} of model "${modelId}" is ${stateName(version.state)}, not READY`,
          { metadata: { model: modelId, version: versionId, state: stateName(version.state) } },
        );
      }
      return version;
    }
    const stable = stableVersion(found);
    if (stable === undefined) {
      throw Errors.modelNotReady(`model "${modelId}" has no READY version`, { metadata: { model: modelId } });
    }
    return stable;
  }

  /** Changes a model's rollout in one step: promote, roll back or set shares; the result is checked like any policy. */
  async updateRollout(model: string, action: UpdateRolloutRequest['action']): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    const now = this.clock.date();
    const stored = await this.mutate(modelId, (current) => {
      const model = existing(current, modelId);
      model.rollout = checkRollout(applyRolloutAction(model, action), model);
      const paused = pauseAutoRollout(
        model,
        action.case === 'pause' ? 'paused' : `paused by a manual rollout change (${action.case ?? 'none'})`,
        now,
      );
      if (action.case === 'pause' && !paused) {
        throw Errors.noRolloutInProgress(`rollout: model "${modelId}" has no automatic rollout in progress to pause`, {
          metadata: { model: modelId },
        });
      }
      return model;
    });
    this.logger.info('rollout updated', {
      model: modelId,
      action: action.case ?? 'none',
      rollout: stored?.rollout === undefined ? 'none' : toJsonString(RolloutPolicySchema, stored.rollout),
    });
    return stored!;
  }

  /** Replaces how the router caches a model's results; an empty policy clears it. */
  async setCachePolicy(model: string, policy: CachePolicy | undefined): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    if (policy !== undefined) {
      if (policy.ttlMs < 0n || policy.ttlMs > MAX_CACHE_TTL_MS) {
        throw Errors.invalidRequest(
          `cache: ttl_ms is ${policy.ttlMs}; it must be from 0 (the router's default) to ${MAX_CACHE_TTL_MS} (7 days)`,
        );
      }
      if (policy.maxEntryBytes < 0n)
        throw Errors.invalidRequest(`cache: max_entry_bytes is ${policy.maxEntryBytes}; it cannot be negative`);
    }
    const empty = policy === undefined || equals(CachePolicySchema, policy, create(CachePolicySchema));
    const stored = await this.mutate(modelId, (current) => {
      const model = existing(current, modelId);
      model.cache = empty ? undefined : policy;
      return model;
    });
    this.logger.info('cache policy set', {
      model: modelId,
      cache: stored?.cache === undefined ? 'defaults' : toJsonString(CachePolicySchema, stored.cache),
    });
    return stored!;
  }

  /** Replaces a model's rollout policy, checked against its versions; an empty one clears it. */
  async setRollout(model: string, policy: RolloutPolicy | undefined): Promise<Model> {
    const modelId = parseModelName(model, 'model');
    const fallback = policy?.fallbackModel ?? '';
    if (fallback === modelId) throw Errors.invalidRequest(`rollout: model "${modelId}" cannot be its own fallback`);
    if (fallback !== '' && (await this.store(() => this.models.get(fallback))) === undefined) {
      throw Errors.invalidRequest(`rollout: the fallback model "${fallback}" does not exist`);
    }
    const now = this.clock.date();
    const stored = await this.mutate(modelId, (current) => {
      const model = existing(current, modelId);
      model.rollout = checkRollout(policy, model);
      pauseAutoRollout(model, 'paused by a manual rollout change (a new policy)', now);
      return model;
    });
    this.logger.info('rollout policy set', {
      model: modelId,
      rollout: stored?.rollout === undefined ? 'none' : toJsonString(RolloutPolicySchema, stored.rollout),
    });
    return stored!;
  }

  /**
   * Records the state a worker reports for a version: LOADING, READY, or FAILED with a reason. A
   * version outside its model's serving set (DRAINING, RETIRED, or not selected) keeps its state: a
   * late LOADING or READY report does not bring it back. A FAILED report is recorded unless the
   * version is RETIRED. A READY report records whether the worker warmed the version up
   * (`warmUpError` empty) or serves it without, and why: the last READY report says. The version is
   * returned as stored.
   */
  async reportState(
    name: string,
    state: VersionState,
    reason: string,
    workerId: string,
    warmUpError = '',
  ): Promise<ModelVersion> {
    const { modelId, versionId } = parseVersionName(name, 'name');
    if (!REPORTABLE_STATES.has(state)) {
      throw Errors.invalidRequest(`a worker may report LOADING, READY or FAILED, not ${stateName(state)}`);
    }
    const stateReason = state === VersionState.FAILED ? reason || 'failed (no reason given)' : '';
    const coldReason = state === VersionState.READY ? bounded(warmUpError) : '';
    const now = timestampFromDate(this.clock.date());
    let outcome = 'unchanged' as 'recorded' | 'unchanged' | 'ignored';
    const stored = await this.mutate(modelId, (current) => {
      const model = existing(current, modelId);
      const version = existingVersion(model, modelId, versionId);
      outcome = 'unchanged';
      const readyWorkers = new Set(version.readyWorkerIds);
      if (state === VersionState.READY) readyWorkers.add(workerId);
      else readyWorkers.delete(workerId);
      const sameWorkers =
        readyWorkers.size === version.readyWorkerIds.length && version.readyWorkerIds.every((w) => readyWorkers.has(w));
      const sameWarmUp = state !== VersionState.READY || version.warmUpError === coldReason;
      if (version.state === state && version.stateReason === stateReason && sameWorkers && sameWarmUp) return undefined;
      const outside = state !== VersionState.FAILED && !servingSet(model).has(versionId);
      if (version.state === VersionState.RETIRED || outside) {
        outcome = 'ignored';
        return undefined;
      }
      version.readyWorkerIds = [...readyWorkers].sort();
      // One worker loading the version again, or failing to, does not take it from the workers that serve it.
      const keptReady = state !== VersionState.READY && version.state === VersionState.READY && readyWorkers.size > 0;
      if (!keptReady) {
        version.state = state;
        version.stateReason = stateReason;
        version.warmUpError = coldReason;
      }
      version.updateTime = now;
      outcome = 'recorded';
      return model;
    });
    const version = findVersion(stored, versionId)!;
    if (outcome === 'recorded') {
      this.logger.info('model version state reported', {
        version: name,
        state: stateName(state),
        reason: stateReason,
        worker_id: workerId,
        ...(coldReason !== '' && { warm_up_error: coldReason }),
      });
    } else if (outcome === 'ignored') {
      this.logger.info('model version state report ignored: the version is outside its serving set', {
        version: name,
        reported: stateName(state),
        state: stateName(version.state),
        worker_id: workerId,
      });
    }
    return version;
  }

  /**
   * Changes the model settings the update mask names: labels, pinned, version_policy (unset: latest 1)
   * and unloaded (explicit model control: an unloaded model's versions drain and none serves until it
   * is loaded again). Each is checked; the version states follow at once.
   */
  async updateModel(update: Model | undefined, paths: readonly string[]): Promise<Model> {
    const modelId = parseModelName(update?.name ?? '', 'model.name');
    const fields = checkUpdateMask(paths);
    const labels = fields.has('labels') ? checkLabels(update?.labels ?? {}) : undefined;
    const stored = await this.mutate(modelId, (current) => {
      const model = existing(current, modelId);
      if (labels !== undefined) model.labels = labels;
      if (fields.has('pinned')) model.pinned = update?.pinned ?? false;
      if (fields.has('version_policy')) model.versionPolicy = checkVersionPolicy(update?.versionPolicy, model);
      if (fields.has('unloaded')) model.unloaded = update?.unloaded ?? false;
      return model;
    });
    this.logger.info('model updated', {
      model: modelId,
      fields: [...fields].join(','),
      pinned: stored!.pinned,
      unloaded: stored!.unloaded,
      version_policy: describeVersionPolicy(stored!.versionPolicy),
      labels: Object.keys(stored!.labels).length,
    });
    return stored!;
  }

  /**
   * Retires a version for good: it stops being loaded and never serves again, whatever the policies
   * say later. Refused with FAILED_PRECONDITION (VERSION_IN_USE) while it takes traffic: while the
   * rollout policy names it, or while it is READY in the serving set. A loaded version drains first
   * (DRAINING, then RETIRED after the drain grace period); one that is not goes RETIRED at once.
   */
  async retireVersion(name: string): Promise<ModelVersion> {
    const { modelId, versionId } = parseVersionName(name, 'name');
    const now = this.clock.date();
    let retired = false;
    const stored = await this.mutate(modelId, (current) => {
      retired = false;
      const model = applyLifecycle(existing(current, modelId), now, this.config.drainGraceMs).model;
      const version = existingVersion(model, modelId, versionId);
      if (hasEnded(version)) return undefined;
      const why = whyServing(model, versionId);
      if (why !== undefined) {
        throw Errors.versionInUse(`version ${versionId} of model ${modelId} still serves traffic: ${why}`, {
          metadata: { model: modelId, version: versionId },
        });
      }
      if (version.state === VersionState.READY || version.state === VersionState.DRAINING) {
        // Loaded: it drains first. A DRAINING version keeps the time it started to.
        if (version.state === VersionState.READY) version.updateTime = timestampFromDate(now);
        version.state = VersionState.DRAINING;
        version.stateReason = RETIRING_REASON;
      } else {
        version.state = VersionState.RETIRED;
        version.stateReason = '';
        version.updateTime = timestampFromDate(now);
      }
      retired = true;
      return model;
    });
    const version = findVersion(stored, versionId)!;
    if (retired) this.logger.info('model version retired', { version: name, state: stateName(version.state) });
    return version;
  }

  /**
   * Deletes a model and its versions; their artifacts stay (content addressed, they may be shared).
   * Refused with FAILED_PRECONDITION (MODEL_IN_USE) while any version is loaded (LOADING, READY or
   * DRAINING): unload the model first and let it drain; and while another model names it as its
   * fallback model.
   */
  async deleteModel(name: string): Promise<void> {
    const modelId = parseModelName(name, 'name');
    const dependents = (await this.store(() => this.models.list()))
      .filter((m) => m.rollout?.fallbackModel === modelId)
      .map((m) => `"${m.name.slice('models/'.length)}"`);
    if (dependents.length > 0) {
      throw Errors.modelInUse(
        `model "${modelId}" is the fallback model of model ${dependents.join(', ')}; change ${dependents.length === 1 ? 'its' : 'their'} rollout policy first`,
        { metadata: { model: modelId } },
      );
    }
    const now = this.clock.date();
    const deleted = await this.store(() =>
      this.models.delete(modelId, (current) => {
        const { model } = applyLifecycle(current, now, this.config.drainGraceMs);
        const loaded = model.versions.filter((v) => LOADED_STATES.has(v.state));
        if (loaded.length === 0) return;
        const states = loaded.map((v) => `version ${versionIdOf(v.name)} is ${stateName(v.state)}`).join(', ');
        throw Errors.modelInUse(
          `model "${modelId}" is still loaded (${states}); unload it first: \`infermesh models unload ${modelId}\` or POST /v2/repository/models/${modelId}/unload, and wait for it to drain`,
          { metadata: { model: modelId } },
        );
      }),
    );
    if (!deleted) throw Errors.modelNotFound(`model "${modelId}" not found`, { metadata: { model: modelId } });
    this.logger.info('model deleted', { model: modelId });
    void this.watch.notify();
  }

  /**
   * Applies the lifecycle to every model whose states it would change now: chiefly versions that have
   * drained for the grace period become RETIRED (REGISTERED for an unloaded model). Returns the
   * number of models changed.
   */
  async sweep(): Promise<number> {
    const now = this.clock.date();
    let changed = 0;
    // Not through store(): the sweeper retries on its own, without a warning a second while Redis is down.
    for (const model of await this.models.list()) {
      if (applyLifecycle(model, now, this.config.drainGraceMs).transitions.length === 0) continue;
      await this.mutate(model.name.slice('models/'.length), () => undefined);
      changed += 1;
    }
    return changed;
  }

  async onApplicationShutdown(): Promise<void> {
    await this.models.close();
  }

  private async existingModel(modelId: string): Promise<Model> {
    const model = await this.store(() => this.models.get(modelId));
    if (model === undefined)
      throw Errors.modelNotFound(`model "${modelId}" not found`, { metadata: { model: modelId } });
    return model;
  }

  /**
   * Changes one model as `change` decides (automatic rollouts' decisions), like every change here:
   * atomically, with its version states then brought in line with its serving set.
   */
  async changeModel(modelId: string, change: ModelMutation): Promise<Model | undefined> {
    return this.mutate(modelId, change);
  }

  /**
   * Changes one model, then brings its version states in line with its serving set, in one atomic
   * update; logs the state changes and tells the watchers. A change that returns undefined still
   * applies the lifecycle (a version may have drained meanwhile).
   */
  private async mutate(modelId: string, change: ModelMutation): Promise<Model | undefined> {
    const now = this.clock.date();
    let transitions: Transition[] = [];
    let wrote = false;
    const stored = await this.store(() =>
      this.models.update(modelId, (current) => {
        transitions = [];
        wrote = false;
        const changed = change(current);
        const base = changed ?? current;
        if (base === undefined) return undefined;
        const result = applyLifecycle(base, now, this.config.drainGraceMs);
        transitions = result.transitions;
        wrote = changed !== undefined || transitions.length > 0;
        return wrote ? result.model : undefined;
      }),
    );
    for (const t of transitions) {
      this.logger.info('model version state changed', {
        version: t.version,
        from: stateName(t.from),
        to: stateName(t.to),
        reason: t.reason,
      });
    }
    if (wrote) void this.watch.notify();
    return stored;
  }

  /** Runs a store operation; a store failure (Redis unreachable...) is UNAVAILABLE, not INTERNAL. */
  private async store<T>(operation: () => Promise<T>): Promise<T> {
    try {
      return await operation();
    } catch (error) {
      if (error instanceof RpcError) throw error;
      this.logger.warn('model store operation failed', { err: error instanceof Error ? error.message : String(error) });
      throw Errors.upstreamUnavailable(
        `the registry's model store is unavailable: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
  }
}

function findVersion(model: Model | undefined, versionId: string): ModelVersion | undefined {
  return model?.versions.find((v) => versionIdOf(v.name) === versionId);
}

function existing(model: Model | undefined, modelId: string): Model {
  if (model === undefined) throw Errors.modelNotFound(`model "${modelId}" not found`, { metadata: { model: modelId } });
  return model;
}

function existingVersion(model: Model, modelId: string, versionId: string): ModelVersion {
  const version = findVersion(model, versionId);
  if (version === undefined) {
    throw Errors.versionNotFound(`model "${modelId}" has no version ${versionId}`, {
      metadata: {
        model: modelId,
        version: versionId,
      },
    });
  }
  return version;
}

/** A reported message cut to MAX_WARM_UP_ERROR_CHARS. */
function bounded(message: string): string {
  return message.length <= MAX_WARM_UP_ERROR_CHARS ? message : `${message.slice(0, MAX_WARM_UP_ERROR_CHARS - 1)}…`;
}

/** An existing version registered again: the same request is idempotent, a different one a conflict. */
function checkSameVersion(existing: ModelVersion, sha256: string, request: CreateModelVersionRequest): ModelVersion {
  const { maxBatchSize } = request;
  const existingSha = existing.artifact?.sha256 ?? '';
  if (existingSha !== sha256) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with artifact ${existingSha}; register the new artifact as a new version`,
      { metadata: { version: existing.name, sha256: existingSha } },
    );
  }
  const existingBatch = existing.signature?.maxBatchSize ?? 0;
  if (maxBatchSize !== undefined && maxBatchSize !== existingBatch) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with max_batch_size ${existingBatch}, not ${maxBatchSize}`,
      { metadata: { version: existing.name } },
    );
  }
  if (!sameProcessing(existing.processing, request.processing)) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with a different processing; register the new processing as a new version`,
      { metadata: { version: existing.name } },
    );
  }
  if (!sameBatching(existing.batching, request.batching)) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with a different batching; register the new batching as a new version`,
      { metadata: { version: existing.name } },
    );
  }
  if (!sameWarmUp(existing.warmUp, request.warmUp, existing.signature!)) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with a different warm_up; register the new warm-up as a new version`,
      { metadata: { version: existing.name } },
    );
  }
  if (!sameExecution(existing.execution, request.execution)) {
    throw Errors.alreadyExists(
      `${existing.name} already exists with a different execution; register the new execution as a new version`,
      { metadata: { version: existing.name } },
    );
  }
  return existing;
}

/**
 * Gauges of the models and versions in the store, read at scrape time so that they are right whichever
 * replica made the changes. One store read serves both gauges of a scrape.
 */
function registerGauges(metrics: Metrics, store: ModelStore, logger: JsonLogger, clock: Clock): void {
  let last: Model[] = [];
  let pending: { at: number; models: Promise<Model[]> } | undefined;
  const snapshot = (): Promise<Model[]> => {
    if (pending === undefined || clock.monotonic() - pending.at > 1_000) {
      pending = {
        at: clock.monotonic(),
        models: store.list().then(
          (models) => (last = models),
          (error: unknown) => {
            logger.warn('model gauges: store unavailable, reporting the last values', {
              err: error instanceof Error ? error.message : String(error),
            });
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
        for (const version of model.versions)
          counts.set(stateName(version.state), (counts.get(stateName(version.state)) ?? 0) + 1);
      }
      for (const [state, count] of counts) this.set({ state }, count);
    },
  });
  new Gauge({
    name: `${metrics.prefix}rollout_phase`,
    help: "The phase of each model's automatic rollout (its last one): 1 for the current phase (progressing, paused, promoted, rolled_back, aborted), 0 for the others.",
    labelNames: ['model', 'phase'],
    registers: [metrics.registry],
    async collect() {
      this.reset();
      for (const model of await snapshot()) {
        if (model.autoRollout === undefined) continue;
        for (const phase of Object.values(AutoRolloutPhase)) {
          if (typeof phase !== 'number' || phase === AutoRolloutPhase.UNSPECIFIED) continue;
          this.set(
            { model: model.name.slice('models/'.length), phase: phaseName(phase) },
            phase === model.autoRollout.phase ? 1 : 0,
          );
        }
      }
    },
  });
  new Gauge({
    name: `${metrics.prefix}rollout_canary_percent`,
    help: "The share of requests each model's canary takes, in percent (0 without a canary).",
    labelNames: ['model'],
    registers: [metrics.registry],
    async collect() {
      this.reset();
      for (const model of await snapshot())
        this.set({ model: model.name.slice('models/'.length) }, model.rollout?.canary?.percent ?? 0);
    },
  });
}
