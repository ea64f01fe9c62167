import * as ort from 'onnxruntime-node';

/**
 * A session of `model` in this process with the settings the worker's execution threads use
 * (services/worker/src/execution-thread.js): the benchmarks' in-process reference.
 */
export function workerSession(model: Uint8Array, intraOpThreads: number): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(model, {
    executionProviders: ['cpu'],
    intraOpNumThreads: intraOpThreads,
    interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
    extra: { session: { intra_op: { allow_spinning: '0' } } },
  });
}
