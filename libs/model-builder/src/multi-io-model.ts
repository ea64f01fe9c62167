import { type BuiltModel, encodeModel, floatInitializer, int64Initializer, node } from './onnx-graph';

/**
 * Several inputs and outputs of different datatypes, each with a dynamic batch dimension:
 * inputs "x" FP32 [-1, 4] and "ids" INT64 [-1, 2]; outputs "y" FP32 [-1, 4] = x * 2,
 * "ids_plus_one" INT64 [-1, 2] = ids + 1, "positive" BOOL [-1, 4] = x > 0.
 */
export function buildMultiIoModel(): BuiltModel {
  return encodeModel('multi-io', {
    nodes: [
      node('Mul', ['x', 'two'], ['y'], 'double'),
      node('Add', ['ids', 'one'], ['ids_plus_one'], 'increment'),
      node('Greater', ['x', 'zero'], ['positive'], 'is_positive'),
    ],
    initializers: [
      floatInitializer('two', [], Float32Array.of(2)),
      floatInitializer('zero', [], Float32Array.of(0)),
      int64Initializer('one', [], BigInt64Array.of(1n)),
    ],
    inputs: [
      { name: 'x', datatype: 'FP32', shape: [-1, 4] },
      { name: 'ids', datatype: 'INT64', shape: [-1, 2] },
    ],
    outputs: [
      { name: 'y', datatype: 'FP32', shape: [-1, 4] },
      { name: 'ids_plus_one', datatype: 'INT64', shape: [-1, 2] },
      { name: 'positive', datatype: 'BOOL', shape: [-1, 4] },
    ],
  });
}
