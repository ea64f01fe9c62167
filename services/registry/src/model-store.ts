import type { Model } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/**
 * Decides the new state of one model from its current state (undefined when it does not exist):
 * the model to store, or undefined to leave it unchanged. It may throw to abort the update. It may be
 * called more than once when a concurrent writer wins a race, so it must not have side effects.
 */
export type ModelMutation = (current: Model | undefined) => Model | undefined;

/**
 * Checks that a model may be deleted as it is now; throws to refuse. Like a mutation it may be
 * called more than once and must not have side effects.
 */
export type DeleteCheck = (current: Model) => void;

/**
 * Where the registry's metadata lives: one record per model with its versions. Every change is
 * atomic per model and bumps a store-wide revision, so watchers can tell that something changed;
 * the changed model is stamped with that revision (Model.revision).
 */
export abstract class ModelStore {
  /** The model by its id (the `{model}` of `models/{model}`), or undefined. */
  abstract get(modelId: string): Promise<Model | undefined>;
  /** Every model, ordered by name. */
  abstract list(): Promise<Model[]>;
  /**
   * Applies a mutation atomically: no concurrent change to the same model is lost. Resolves to the
   * model as stored afterwards (the current one when the mutation left it unchanged), its revision
   * the store revision of its last change.
   */
  abstract update(modelId: string, mutate: ModelMutation): Promise<Model | undefined>;
  /**
   * Deletes a model atomically, when `check` (given the model as it is at that moment) does not
   * throw; bumps the store-wide revision. Resolves to false when there is no such model.
   */
  abstract delete(modelId: string, check?: DeleteCheck): Promise<boolean>;
  /** The store-wide revision: 0 for an empty store, then one more on every change. */
  abstract revision(): Promise<number>;
  /** Releases connections and files. */
  abstract close(): Promise<void>;
}
