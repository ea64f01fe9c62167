import type { Tensor, TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

/** A model loaded into the runtime, ready to run. */
export interface ModelSession {
  /** The execution provider that created the session, e.g. "cuda" or "cpu". */
  readonly executionProvider: string;
  /** The model's inputs and outputs as the session reads them; -1 for a dynamic dimension. */
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  /**
   * Runs the model on raw tensors; returns the named outputs in the order asked for (all outputs,
   * in the model's order, when `outputNames` is empty). Bad input rejects with INVALID_ARGUMENT.
   */
  run(inputs: readonly Tensor[], outputNames: readonly string[]): Promise<Tensor[]>;
  /** Frees the session; it must not run again. */
  release(): Promise<void>;
}

/** Why a model could not become a session: every provider tried, and what each said. */
export class ModelLoadError extends Error {
  override readonly name = 'ModelLoadError';
}

/**
 * Where models run. The first implementation runs sessions on the service's own thread; the port
 * keeps tensors raw so that an implementation on worker threads can pass them along unchanged.
 */
export abstract class ModelRuntime {
  /** Creates a session, trying the execution providers in order; throws ModelLoadError. */
  abstract load(model: Uint8Array, executionProviders: readonly string[]): Promise<ModelSession>;
}
