import type { Tensor, TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeInfo, datatypeName } from './datatypes';
import { quoted } from './bounded-text';
import { decodeBytesElements } from './bytes-elements';
import { elementCount, formatShape, shapeMatches } from './shape';

/**
 * Checks request inputs against a model's declared inputs: every declared input given once and no
 * other, datatypes equal, shapes fitting the declared ones (-1 = any size), batch dimension within
 * the maximum, and data lengths matching the shapes. Returns the first problem, naming the tensor,
 * or undefined when the inputs are valid.
 */
export function checkInputs(
  model: string,
  declared: readonly TensorSpec[],
  inputs: readonly Tensor[],
  maxBatchSize = 0,
): string | undefined {
  const specs = new Map(declared.map((spec) => [spec.name, spec]));
  const seen = new Set<string>();
  for (const input of inputs) {
    const spec = specs.get(input.name);
    if (spec === undefined) {
      return `model ${quoted(model)} has no input ${quoted(input.name)}; its inputs are ${[...specs.keys()].map(quoted).join(', ')}`;
    }
    if (seen.has(input.name)) return `input ${quoted(input.name)} is given more than once`;
    seen.add(input.name);
    if (input.datatype !== spec.datatype) {
      return `input ${quoted(input.name)} has datatype ${datatypeName(input.datatype)} but model ${quoted(model)} expects ${datatypeName(spec.datatype)}`;
    }
    if (input.shape.some((d) => d < 0n))
      return `input ${quoted(input.name)} has a negative dimension in shape ${formatShape(input.shape)}`;
    if (!shapeMatches(spec.shape, input.shape)) {
      return `input ${quoted(input.name)} has shape ${formatShape(input.shape)} but model ${quoted(model)} expects ${formatShape(spec.shape)}`;
    }
    if (maxBatchSize > 0 && input.shape.length > 0 && Number(input.shape[0]) > maxBatchSize) {
      return `input ${quoted(input.name)} has batch size ${input.shape[0]} but model ${quoted(model)} allows at most ${maxBatchSize}`;
    }
    const problem = checkData(input);
    if (problem !== undefined) return problem;
  }
  for (const name of specs.keys()) {
    if (!seen.has(name)) return `input ${quoted(name)} of model ${quoted(model)} is missing`;
  }
  return undefined;
}

/** Checks that a tensor's data length agrees with its shape and datatype. */
export function checkData(tensor: Tensor): string | undefined {
  const count = elementCount(tensor.shape);
  if (tensor.datatype === DataType.BYTES) {
    const elements = decodeBytesElements(tensor.data);
    if (elements === undefined) return `input ${quoted(tensor.name)}: BYTES data has a broken 4-byte length prefix`;
    if (elements.length !== count) {
      return `input ${quoted(tensor.name)} has ${elements.length} BYTES elements but shape ${formatShape(tensor.shape)} needs ${count}`;
    }
    return undefined;
  }
  const expected = count * datatypeInfo(tensor.datatype).byteSize;
  if (tensor.data.byteLength !== expected) {
    return `input ${quoted(tensor.name)} has ${tensor.data.byteLength} bytes of data but shape ${formatShape(tensor.shape)} of ${datatypeName(tensor.datatype)} needs ${expected}`;
  }
  return undefined;
}
