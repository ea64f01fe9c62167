import { type BuiltModel, encodeModel, floatInitializer, type ProcessingInit, node } from './onnx-graph';

/**
 * The classifier's weights, row-major [4, 5]: scores = input · CLASSIFIER_WEIGHT + CLASSIFIER_BIAS.
 * Class i < 4 scores feature i; class 4 scores (x0 + x1 - x2 - x3) / 2 + 0.25. Every value is a
 * short binary fraction, so scores of such inputs are exact and can be checked by hand.
 */
export const CLASSIFIER_WEIGHT: readonly number[] = [
  1,
  0,
  0,
  0,
  0.5, //
  0,
  1,
  0,
  0,
  0.5,
  0,
  0,
  1,
  0,
  -0.5,
  0,
  0,
  0,
  1,
  -0.5,
];
export const CLASSIFIER_BIAS: readonly number[] = [0, 0, 0, 0, 0.25];
/** The label of each of the five classes, by index. */
export const CLASSIFIER_LABELS: readonly string[] = ['cat', 'dog', 'bird', 'fish', 'mixed'];
/** The per-feature normalization of "input": y = (x - mean) / std. */
export const CLASSIFIER_MEAN: readonly number[] = [1, 2, 3, 4];
export const CLASSIFIER_STD: readonly number[] = [2, 4, 0.5, 1];

/** What the classifier is registered with: "input" normalized per feature, "scores" labelled. */
export const CLASSIFIER_PROCESSING: ProcessingInit = {
  inputNormalizations: [{ input: 'input', mean: [...CLASSIFIER_MEAN], std: [...CLASSIFIER_STD] }],
  outputLabels: [{ output: 'scores', labels: [...CLASSIFIER_LABELS] }],
};

/**
 * input "input" FP32 [-1, 4] -> output "scores" FP32 [-1, 5] = MatMul(input, W) + b, registered
 * with CLASSIFIER_PROCESSING: the demo of input normalization and of top-k classification
 * (`class_count` on "scores").
 */
export function buildClassifierModel(): BuiltModel {
  const built = encodeModel('classifier', {
    nodes: [
      node('MatMul', ['input', 'weight'], ['matmul'], 'matmul'),
      node('Add', ['matmul', 'bias'], ['scores'], 'add'),
    ],
    initializers: [
      floatInitializer('weight', [4, 5], Float32Array.from(CLASSIFIER_WEIGHT)),
      floatInitializer('bias', [5], Float32Array.from(CLASSIFIER_BIAS)),
    ],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
    outputs: [{ name: 'scores', datatype: 'FP32', shape: [-1, 5] }],
  });
  return { ...built, processing: CLASSIFIER_PROCESSING };
}
