import type { Tensor, TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

/** The outputs of one run and the time the model took to compute them. */
export interface RunResult {
  outputs: Tensor[];
  computeMs: number;
  /** Which of the model's execution instances ran it (its thread's id). */
  instance: number;
}

/** A model loaded into the runtime, ready to run. */
export interface ModelSession {
  /** The execution provider that created the session, e.g. "cuda" or "cpu". */
  readonly executionProvider: string;
  /** The model's inputs and outputs as the session reads them; -1 for a dynamic dimension. */
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  /** Execution instances: how many runs can compute at once. */
  readonly instanceCount: number;
  /**
   * Runs the model on raw tensors; returns the named outputs in the order asked for (all outputs,
   * in the model's order, when `outputNames` is empty). Bad input rejects with INVALID_ARGUMENT, a
   * datatype the runtime cannot hold with UNIMPLEMENTED, a failed execution instance with UNAVAILABLE.
   */
  run(inputs: readonly Tensor[], outputNames: readonly string[]): Promise<RunResult>;
  /** Waits for the runs in progress, then frees the session; it must not run again. */
  release(): Promise<void>;
}

/** Why a model could not become a session: every provider tried, and what each said. */
export class ModelLoadError extends Error {
  override readonly name = 'ModelLoadError';
}

/** How ModelRuntime.load creates a session. */
export interface LoadOptions {
  /**
   * The directory the model's external data (initializers stored outside it) is read from while the
   * session starts; with `reload`, instances started later (in place of one that died) load what
   * `reload` returns, without it.
   */
  weightsDir?: string;
  /** The operator threads of each instance; unset: the runtime's. */
  intraOpThreads?: number;
}

/**
 * Where models run: ThreadsModelRuntime (model-runtime.threads.ts) runs each session in worker
 * threads, off the service's event loop; tensors stay raw bytes across the port.
 */
export abstract class ModelRuntime {
  /**
   * Creates a session, trying the execution providers in order; throws ModelLoadError. With `reload`,
   * the runtime lets go of `model` once the session has started and calls `reload` for the bytes when
   * it needs them again (to replace an execution instance that died), so that a loaded model does not
   * also keep its artifact in the service's memory; without it, the runtime keeps `model`.
   */
  abstract load(
    model: Uint8Array,
    executionProviders: readonly string[],
    reload?: () => Promise<Uint8Array>,
    options?: LoadOptions,
  ): Promise<ModelSession>;

  /**
   * Pays the runtime's one-time start-up costs (its native library, global environment and thread
   * pools) by loading and releasing a minimal model, so that the memory measured across the first
   * real load is that model's own.
   */
  async prepare(executionProviders: readonly string[]): Promise<void> {
    const session = await this.load(PREPARATION_MODEL, executionProviders);
    await session.release();
  }
}

/**
 * A minimal ONNX model: one FP32 Identity, "fp32_in" [batch, batch] -> "fp32_out". These are the bytes
 * buildIdentityModel(['FP32'], 'runtime-preparation') from libs/model-builder writes; a spec checks
 * that they still are.
 */
export const PREPARATION_MODEL = Buffer.from(
  'CAgSF2luZmVybWVzaC1tb2RlbC1idWlsZGVyGgExOosBCikKB2ZwMzJfaW4SCGZwMzJfb3V0GgppZGVudGl0eV8wIghJZGVudGl0eRITcnVudGltZS1wcmVwYXJhdGlvblojCgdmcDMyX2luEhgKFggBEhIKBxIFYmF0Y2gKBxIFYmF0Y2hiJAoIZnAzMl9vdXQSGAoWCAESEgoHEgViYXRjaAoHEgViYXRjaEIECgAQEQ==',
  'base64',
);
