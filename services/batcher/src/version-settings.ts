import { equals } from '@bufbuild/protobuf';
import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { createClient, toRpcError, Errors } from '@infermesh/grpc';
import {
  BatchingSchema,
  type Model,
  type ModelVersion,
  RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { versionIdOf } from '@infermesh/rollout';
import { LookupMemo } from '@infermesh/runtime';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import { type BatchingPolicy, batchingPolicy } from './batching-policy';

const LOOKUP_TIMEOUT_MS = 2_000;

/** States of a version the batcher takes requests for: READY, and DRAINING for the late ones routed before it began to drain. */
const ACCEPTED = new Set([VersionState.READY, VersionState.DRAINING]);

/**
 * Each version's batching policy. It comes from the registry watch, so a change of a version's
 * batching applies to the batches formed after its message arrives, and while the registry is down
 * the last settings the watch saw stay. A version of a model the watch does not hold (it has not
 * synced yet) is read from the registry instead and reused for BATCHER_SETTINGS_TTL_MS; past that it
 * is read again in the background while the last one keeps serving, also while the registry is down.
 */
@Injectable()
export class VersionSettings implements OnApplicationShutdown {
  private readonly client;
  private readonly memo: LookupMemo<BatchingPolicy>;
  /** The policy last built for each watched version, kept while its inputs are unchanged so that queues adopt only real changes. */
  private readonly watched = new Map<string, { version: ModelVersion; policy: BatchingPolicy }>();

  constructor(
    @Inject(BATCHER_CONFIG) private readonly config: BatcherConfig,
    private readonly watch: RegistryWatch,
    clock: Clock,
  ) {
    this.client = createClient(RegistryService, config.registryAddress);
    this.memo = new LookupMemo(
      async (name) => {
        const [, model, , versionId] = name.split('/') as [string, string, string, string];
        try {
          const { version } = await this.client.resolveModelVersion(
            { model: `models/${model}`, versionId },
            { timeoutMs: LOOKUP_TIMEOUT_MS },
          );
          if (version === undefined) throw Errors.internal('the registry answered without a version');
          return batchingPolicy(version, config.defaults);
        } catch (error) {
          const rpcError = toRpcError(error);
          if (rpcError.reason !== undefined) throw rpcError; // e.g. VERSION_NOT_FOUND, as the registry said it
          throw Errors.upstreamUnavailable(
            `the batching settings of model "${model}" version ${versionId} cannot be read from the registry: ${rpcError.message}`,
          );
        }
      },
      { ttlMs: config.settingsTtlMs, keepStale: true, clock },
    );
    watch.onChange((models) => {
      // A model the watch came to hold is read from it from now on, and one it dropped afresh.
      this.memo.clear();
      for (const modelId of models) this.forgetGone(modelId);
    });
  }

  /** The policy of models/{model}/versions/{version}. */
  async policy(versionName: string): Promise<BatchingPolicy> {
    const [, modelId, , versionId] = versionName.split('/') as [string, string, string, string];
    const model = this.watch.model(modelId);
    if (model === undefined) return this.memo.get(versionName);
    return this.watchedPolicy(versionName, modelId, versionId, model);
  }

  /** Calls the listener with the ids of the models whose settings or versions changed in the registry. */
  onChange(listener: (models: readonly string[]) => void): void {
    this.watch.onChange(listener);
  }

  onApplicationShutdown(): void {
    this.client.close();
  }

  /** Forgets the policies of a model's versions that the watch no longer holds. */
  private forgetGone(modelId: string): void {
    const model = this.watch.model(modelId);
    for (const name of this.watched.keys()) {
      if (name.startsWith(`models/${modelId}/versions/`) && !model?.versions.some((v) => v.name === name))
        this.watched.delete(name);
    }
  }

  private watchedPolicy(versionName: string, modelId: string, versionId: string, model: Model): BatchingPolicy {
    if (model.unloaded) {
      throw Errors.modelNotReady(`model "${modelId}" is unloaded`, { metadata: { model: modelId } });
    }
    const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
    if (version === undefined) {
      throw Errors.versionNotFound(`model "${modelId}" has no version ${versionId}`, {
        metadata: {
          model: modelId,
          version: versionId,
        },
      });
    }
    if (!ACCEPTED.has(version.state)) {
      const state = (VersionState[version.state] ?? String(version.state)).replace(/^VERSION_STATE_/, '');
      throw Errors.modelNotReady(`version ${versionId} of model "${modelId}" is ${state}, not READY`, {
        metadata: { model: modelId, version: versionId, state },
      });
    }
    const known = this.watched.get(versionName);
    if (known !== undefined && (known.version === version || sameInputs(known.version, version))) return known.policy;
    const policy = batchingPolicy(version, this.config.defaults);
    this.watched.set(versionName, { version, policy });
    return policy;
  }
}

/** Whether two records of a version give the same policy: the same batching and signature batch size. */
function sameInputs(a: ModelVersion, b: ModelVersion): boolean {
  if ((a.signature?.maxBatchSize ?? 0) !== (b.signature?.maxBatchSize ?? 0)) return false;
  if (a.batching === undefined || b.batching === undefined) return a.batching === b.batching;
  return equals(BatchingSchema, a.batching, b.batching);
}
