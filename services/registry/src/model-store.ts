import type { Model } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/**
 * Decides the new state of one model from its current state (undefined when it does not exist):
 * the model to store, or undefined to leave it unchanged. It may throw to abort the update. It may be
 * called more than once when a concurrent writer wins a race, so it must not have side effects.
 */
export type ModelMutation = (current: Model | undefined) => Model | undefined;

/**
 * Where the registry's metadata lives: one record per model with its versions. Every change is
 * atomic per model and bumps a store-wide revision, so watchers can tell that something changed.
 */
export abstract class ModelStore {
  /** The model by its id (the `{model}` of `models/{model}`), or undefined. */
  abstract get(modelId: string): Promise<Model | undefined>;
  /** Every model, ordered by name. */
  abstract list(): Promise<Model[]>;
  /**
   * Applies a mutation atomically: no concurrent change to the same model is lost. Resolves to the
   * model as stored afterwards (the current one when the mutation left it unchanged).
   */
  abstract update(modelId: string, mutate: ModelMutation): Promise<Model | undefined>;
  /** The store-wide revision: 0 for an empty store, then one more on every change. */
  abstract revision(): Promise<number>;
  /** Releases connections and files. */
  abstract close(): Promise<void>;
}
