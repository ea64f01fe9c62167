import { onnx } from 'onnx-proto';
import { type BuiltModel, encodeModel, floatInitializer, int64Initializer, node, ONNX_ELEM_TYPE } from './onnx-graph';
import { SeededRandom } from './prng';
import { TINY_BIAS, TINY_WEIGHT } from './tiny-model';

const TINY_INPUT = { name: 'input', datatype: 'FP32', shape: [-1, 4] } as const;
const TINY_OUTPUT = { name: 'output', datatype: 'FP32', shape: [-1, 3] } as const;

/**
 * The tiny model's signature and answers, but failing on part of its inputs, as a broken model
 * version does: it gathers row trunc(input[:, 0]) of a zero table of `rows` rows and adds it, so
 * onnxruntime fails the whole batch at run time ("indices element out of data bounds") when a first
 * feature is outside [-rows, rows). Inputs inside answer exactly as the tiny model does.
 */
export function buildInputRangeModel(rows = 8, name = 'input-range'): BuiltModel {
  return encodeModel(name, {
    nodes: [
      node('MatMul', ['input', 'weight'], ['matmul'], 'matmul'),
      node('Add', ['matmul', 'bias'], ['tiny'], 'add'),
      node('Gather', ['input', 'first_column'], ['first'], 'first', [
        { name: 'axis', type: onnx.AttributeProto.AttributeType.INT, i: 1 },
      ]),
      node('Cast', ['first'], ['row'], 'row', [
        { name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: ONNX_ELEM_TYPE.INT64 },
      ]),
      node('Gather', ['table', 'row'], ['picked'], 'pick'),
      node('Add', ['tiny', 'picked'], ['output'], 'output'),
    ],
    initializers: [
      floatInitializer('weight', [4, 3], Float32Array.from(TINY_WEIGHT)),
      floatInitializer('bias', [3], Float32Array.from(TINY_BIAS)),
      int64Initializer('first_column', [], BigInt64Array.of(0n)),
      floatInitializer('table', [rows, 3], new Float32Array(rows * 3)),
    ],
    inputs: [TINY_INPUT],
    outputs: [TINY_OUTPUT],
  });
}

/**
 * A model with the tiny model's signature that takes far longer per item, as an unoptimized model
 * version does: `layers` products with one tied [hidden, hidden] weight between a projection up from
 * the 4 inputs and one down to the 3 outputs, about `layers` × hidden² multiply-adds per item
 * (16 × 1024²: 17 M) for a weight of hidden² floats (4 MiB).
 */
export function buildSlowModel(options: { hidden?: number; layers?: number; name?: string } = {}): BuiltModel {
  const hidden = options.hidden ?? 1024;
  const layers = options.layers ?? 16;
  const random = new SeededRandom(11);
  const bound = 1 / Math.sqrt(hidden);
  const nodes: onnx.INodeProto[] = [node('MatMul', ['input', 'up'], ['h0'], 'up')];
  for (let i = 0; i < layers; i += 1) nodes.push(node('MatMul', [`h${i}`, 'square'], [`h${i + 1}`], `layer${i}`));
  nodes.push(node('MatMul', [`h${layers}`, 'down'], ['output'], 'down'));
  return encodeModel(options.name ?? 'slow', {
    nodes,
    initializers: [
      floatInitializer('up', [4, hidden], random.uniformFloat32(4 * hidden, -0.5, 0.5)),
      floatInitializer('square', [hidden, hidden], random.uniformFloat32(hidden * hidden, -bound, bound)),
      floatInitializer('down', [hidden, 3], random.uniformFloat32(hidden * 3, -bound, bound)),
    ],
    inputs: [TINY_INPUT],
    outputs: [TINY_OUTPUT],
  });
}
