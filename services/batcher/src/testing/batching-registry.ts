import { create, type MessageInitShape } from '@bufbuild/protobuf';
import {
  type BatchingSchema,
  ModelVersionSchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { FakeRegistry } from '@infermesh/testing';

/**
 * The registry: ResolveModelVersion answers each version's signature and batching. Once a model is put,
 * WatchModels follows its contract; before, it is UNIMPLEMENTED, and the batcher reads the settings
 * with ResolveModelVersion.
 */
export class BatchingRegistry extends FakeRegistry {
  /** Batching by resource name; versions not named here have none (every default). */
  readonly batching = new Map<string, MessageInitShape<typeof BatchingSchema>>();
  maxBatchSize = 8;
  resolveCalls = 0;

  constructor() {
    super({
      watchOnlyOnceChanged: true,
      handlers: {
        resolveModelVersion: async ({ model, versionId }) => {
          this.resolveCalls += 1;
          const name = `${model}/versions/${versionId}`;
          const batching = this.batching.get(name);
          return {
            version: create(ModelVersionSchema, {
              name,
              state: VersionState.READY,
              signature: { maxBatchSize: this.maxBatchSize },
              ...(batching !== undefined && { batching }),
            }),
          };
        },
      },
    });
  }
}
