import { create } from '@bufbuild/protobuf';
import { type Tensor, type TensorSpec, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeInfo, elementCount, encodeBytesElements } from '@infermesh/tensors';

/**
 * Synthetic inputs for a warm-up run: one of each declared input, a dynamic first dimension set to
 * `batch`, every other dynamic dimension 1, zeros for numbers and empty strings for BYTES.
 */
export function warmUpInputs(specs: readonly TensorSpec[], batch = 1): Tensor[] {
  return specs.map((spec) => {
    const shape = spec.shape.map((d, i) => (d >= 0n ? d : i === 0 ? BigInt(batch) : 1n));
    const count = elementCount(shape);
    const data =
      spec.datatype === DataType.BYTES
        ? encodeBytesElements(Array.from({ length: count }, () => new Uint8Array(0)))
        : new Uint8Array(count * datatypeInfo(spec.datatype).byteSize);
    return create(TensorSchema, { name: spec.name, datatype: spec.datatype, shape, data });
  });
}

/**
 * The batch sizes to warm a version up at: the configured ones, "max" meaning its maximum batch size,
 * each at most once; just 1 for a model that does not batch (maxBatchSize 0).
 */
export function warmUpBatchSizes(configured: readonly (number | 'max')[], maxBatchSize: number): number[] {
  if (maxBatchSize <= 0) return [1];
  const sizes = configured.map((s) => Math.min(s === 'max' ? maxBatchSize : s, maxBatchSize));
  return [...new Set(sizes)].sort((a, b) => a - b);
}
