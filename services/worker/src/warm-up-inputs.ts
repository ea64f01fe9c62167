import { create } from '@bufbuild/protobuf';
import { type Tensor, type TensorSpec, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeInfo, elementCount, encodeBytesElements } from '@infermesh/tensors';

/**
 * Inputs for a model's first run: one of each declared input, batch 1, every dynamic dimension 1,
 * zeros for numbers and empty strings for BYTES.
 */
export function warmUpInputs(specs: readonly TensorSpec[]): Tensor[] {
  return specs.map((spec) => {
    const shape = spec.shape.map((d) => (d < 0n ? 1n : d));
    const count = elementCount(shape);
    const data =
      spec.datatype === DataType.BYTES
        ? encodeBytesElements(Array.from({ length: count }, () => new Uint8Array(0)))
        : new Uint8Array(count * datatypeInfo(spec.datatype).byteSize);
    return create(TensorSchema, { name: spec.name, datatype: spec.datatype, shape, data });
  });
}
