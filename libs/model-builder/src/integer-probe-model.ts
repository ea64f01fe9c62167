import { encodeModel, int8Initializer, node, type BuiltModel } from './onnx-graph';

/** The probe's inner dimension: 32 pairs of products per output. */
export const INTEGER_PROBE_DEPTH = 64;
/** Its answer in every column when fed 255s and exact: 64 · 255 · 127. */
export const INTEGER_PROBE_EXACT = INTEGER_PROBE_DEPTH * 255 * 127;

/**
 * A probe of how onnxruntime multiplies uint8 by int8 on this CPU: MatMulInteger of a uint8 input
 * "a" [1, 64] by a constant int8 weight of 127s [64, 8], int32 output "y" [1, 8]. Fed 255s, each
 * column is INTEGER_PROBE_EXACT where the kernel adds its products in 32 bits (x86 with VNNI, and
 * onnxruntime's reference kernels); on x86 CPUs with AVX2 but not VNNI it adds pairs of products in
 * 16 bits, each pair saturating at 32,767 (255 · 127 · 2 is 64,770), and the columns come out smaller.
 * Full-range int8 weights lose accuracy on such a CPU; 7-bit ones (±63) cannot reach the limit.
 */
export function buildIntegerProbeModel(name = 'integer-probe'): BuiltModel {
  const columns = 8;
  return encodeModel(name, {
    nodes: [node('MatMulInteger', ['a', 'b'], ['y'], 'probe')],
    initializers: [
      int8Initializer('b', [INTEGER_PROBE_DEPTH, columns], new Int8Array(INTEGER_PROBE_DEPTH * columns).fill(127)),
    ],
    inputs: [{ name: 'a', datatype: 'UINT8', shape: [1, INTEGER_PROBE_DEPTH] }],
    outputs: [{ name: 'y', datatype: 'INT32', shape: [1, columns] }],
  });
}
