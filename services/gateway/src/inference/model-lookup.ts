import { Injectable } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import type { TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type ModelVersion, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf, versionIdOf } from '@infermesh/rollout';
import { datatypeName } from '@infermesh/tensors';
import { RegistryClient } from '../upstreams/registry.client';

export interface TensorMetadata {
  name: string;
  datatype: string;
  /** -1 marks a dynamic dimension. */
  shape: number[];
}

/** KServe v2 model metadata. */
export interface ModelMetadata {
  name: string;
  versions: string[];
  platform: string;
  inputs: TensorMetadata[];
  outputs: TensorMetadata[];
}

/** One row of the Triton model-repository index. */
export interface RepositoryEntry {
  name: string;
  version: string;
  state: 'READY' | 'LOADING' | 'UNLOADING' | 'UNAVAILABLE';
  reason?: string;
}

function repositoryState(state: VersionState): RepositoryEntry['state'] {
  switch (state) {
    case VersionState.READY:
      return 'READY';
    case VersionState.LOADING:
      return 'LOADING';
    case VersionState.DRAINING:
      return 'UNLOADING';
    case VersionState.UNSPECIFIED:
    case VersionState.REGISTERED:
    case VersionState.RETIRED:
    case VersionState.FAILED:
      return 'UNAVAILABLE';
  }
}

const tensorMetadata = (spec: TensorSpec): TensorMetadata => ({
  name: spec.name,
  datatype: datatypeName(spec.datatype),
  shape: spec.shape.map(Number),
});

/**
 * Looks models up for clients, in the KServe v2 shapes: metadata, readiness, the repository index.
 * The registry answers; nothing is kept here (the registry's ModelCatalog is the store itself).
 */
@Injectable()
export class ModelLookup {
  constructor(private readonly registry: RegistryClient) {}

  /**
   * Metadata of a version, or of the model when no version is given: then the signature is the
   * latest READY version's (the one that would serve), else the latest version's.
   */
  async metadata(model: string, version: string): Promise<ModelMetadata> {
    const found = await this.registry.getModel(model);
    if (found === undefined) throw Errors.modelNotFound(`model "${model}" not found`, { metadata: { model } });
    const live = found.versions.filter((v) => v.state !== VersionState.RETIRED);
    let chosen: ModelVersion | undefined;
    if (version !== '') {
      chosen = found.versions.find((v) => versionIdOf(v.name) === version);
      if (chosen === undefined) {
        throw Errors.versionNotFound(`model "${model}" has no version "${version}"`, {
          metadata: {
            model,
            version,
          },
        });
      }
    } else {
      chosen = live.findLast((v) => v.state === VersionState.READY) ?? live.at(-1) ?? found.versions.at(-1);
    }
    return {
      name: model,
      versions: live.map((v) => versionIdOf(v.name)),
      platform: found.platform,
      inputs: chosen?.signature?.inputs.map(tensorMetadata) ?? [],
      outputs: chosen?.signature?.outputs.map(tensorMetadata) ?? [],
    };
  }

  /** Whether the version (or, with none given, some version) of a model can serve; NOT_FOUND for unknown ones. */
  async ready(model: string, version: string): Promise<boolean> {
    try {
      const resolved = await this.registry.resolveVersion(model, version);
      return resolved?.state === VersionState.READY;
    } catch (error) {
      if (error instanceof RpcError && error.reason === 'MODEL_NOT_READY') return false;
      throw error;
    }
  }

  /** Every version of every model (those `listed` accepts) with its state; only READY ones when `readyOnly`. */
  async repositoryIndex(
    readyOnly: boolean,
    listed: (model: string) => boolean = () => true,
  ): Promise<RepositoryEntry[]> {
    const models = await this.registry.listModels();
    const entries: RepositoryEntry[] = [];
    for (const model of models) {
      const name = modelIdOf(model.name);
      if (!listed(name)) continue;
      for (const v of model.versions) {
        const state = repositoryState(v.state);
        if (readyOnly && state !== 'READY') continue;
        const entry: RepositoryEntry = { name, version: versionIdOf(v.name), state };
        if (v.stateReason !== '') entry.reason = v.stateReason;
        entries.push(entry);
      }
    }
    return entries;
  }
}
