import { type BuiltModel, encodeModel, floatInitializer, node, ONNX_ELEM_TYPE } from './onnx-graph';
import { SeededRandom } from './prng';
import { TINY_BIAS, TINY_WEIGHT } from './tiny-model';

/**
 * The tiny model's graph (input [-1, 4] -> output [-1, 3]) in an artifact of about `artifactBytes`:
 * the rest is an initializer no node reads, which ONNX Runtime drops when it creates the session.
 * A model whose artifact is large but whose loaded session is small, so that the memory a worker
 * charges it is its artifact size: for exercising memory budgets with sizes known in advance.
 * Different seeds give different bytes (and SHA-256s).
 */
export function buildPaddedModel(artifactBytes: number, seed = 1, name = `padded-${seed}`): BuiltModel {
  const padding = new Uint8Array(Math.max(0, artifactBytes - 512));
  const random = new SeededRandom(seed);
  for (let i = 0; i < padding.length; i += 4096) padding[i] = Math.floor(random.next() * 256);
  return encodeModel(name, {
    nodes: [
      node('MatMul', ['input', 'weight'], ['matmul'], 'matmul'),
      node('Add', ['matmul', 'bias'], ['output'], 'add'),
    ],
    initializers: [
      floatInitializer('weight', [4, 3], Float32Array.from(TINY_WEIGHT)),
      floatInitializer('bias', [3], Float32Array.from(TINY_BIAS)),
      { name: 'unused_padding', dims: [padding.length], dataType: ONNX_ELEM_TYPE.UINT8, rawData: padding },
    ],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 3] }],
  });
}
