import {
  ONNX_ELEM_TYPE,
  type BuiltModel,
  encodeModel,
  type ModelDatatype,
  type ModelTensorSpec,
  node,
} from './onnx-graph';

/** Every datatype an identity model can pass through, in KServe names. */
export const IDENTITY_DATATYPES: readonly ModelDatatype[] = Object.keys(ONNX_ELEM_TYPE) as ModelDatatype[];

/**
 * One Identity per datatype: input "<type>_in" -> output "<type>_out" (type in lower case, e.g.
 * "fp16_in"), each [-1, -1]. For checking that tensors of every datatype travel through a session
 * unchanged. Default: every datatype but BF16, which onnxruntime-node cannot hold.
 */
export function buildIdentityModel(
  datatypes: readonly ModelDatatype[] = IDENTITY_DATATYPES.filter((d) => d !== 'BF16'),
  name = 'identity',
): BuiltModel {
  const inputs: ModelTensorSpec[] = datatypes.map((d) => ({
    name: `${d.toLowerCase()}_in`,
    datatype: d,
    shape: [-1, -1],
  }));
  const outputs: ModelTensorSpec[] = datatypes.map((d) => ({
    name: `${d.toLowerCase()}_out`,
    datatype: d,
    shape: [-1, -1],
  }));
  return encodeModel(name, {
    nodes: datatypes.map((_, i) => node('Identity', [inputs[i]!.name], [outputs[i]!.name], `identity_${i}`)),
    initializers: [],
    inputs,
    outputs,
  });
}
