import { availableParallelism } from 'node:os';

/**
 * As many intra-op threads as leaves instances × threads within the machine's cores but one, at least
 * 1. The core left is the event loop's: it decodes, checks and encodes every request, and an ONNX
 * Runtime pool that also wants that core waits, at each parallel operator, for whichever thread the
 * event loop displaced. Measured on 2 cores, one instance (`npm run bench -- quantization`, one
 * thread against two): worker items/s at batch 32 about the same for the FP32 MLP (-3 %), +12 % for its
 * int8 variant and +20 % for the CNN.
 */
export function defaultIntraOpThreads(instancesPerModel: number, cores = availableParallelism()): number {
  return Math.max(1, Math.floor((cores - 1) / instancesPerModel));
}
