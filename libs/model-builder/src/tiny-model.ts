import { type BuiltModel, encodeModel, floatInitializer, node } from './onnx-graph';

/** The tiny model's weights, row-major [4, 3]: output = input · TINY_WEIGHT + TINY_BIAS. */
export const TINY_WEIGHT: readonly number[] = [
  1,
  0,
  0.5, //
  0,
  1,
  -0.5,
  -1,
  2,
  0.25,
  0.5,
  -1,
  1,
];
export const TINY_BIAS: readonly number[] = [0.1, -0.2, 0.3];

/** input "input" FP32 [-1, 4] -> output "output" FP32 [-1, 3] = MatMul(input, W) + b. */
export function buildTinyModel(): BuiltModel {
  return encodeModel('tiny', {
    nodes: [
      node('MatMul', ['input', 'weight'], ['matmul'], 'matmul'),
      node('Add', ['matmul', 'bias'], ['output'], 'add'),
    ],
    initializers: [
      floatInitializer('weight', [4, 3], Float32Array.from(TINY_WEIGHT)),
      floatInitializer('bias', [3], Float32Array.from(TINY_BIAS)),
    ],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 3] }],
  });
}
