import type { onnx } from 'onnx-proto';
import { type BuiltModel, encodeModel, floatInitializer, node, type ModelTensorSpec } from './onnx-graph';
import { SeededRandom } from './prng';

export interface MlpOptions {
  /** Feature sizes from input to output; default [512, 2048, 2048, 512]. */
  sizes?: readonly number[];
  /** PRNG seed of the weights; default 42. */
  seed?: number;
  /** Model name; default "mlp". */
  name?: string;
}

/** One dense layer: `weight` is row-major [inFeatures, outFeatures]. */
export interface MlpLayer {
  readonly inFeatures: number;
  readonly outFeatures: number;
  readonly weight: Float32Array;
  readonly bias: Float32Array;
  /** Every layer but the last is followed by Relu. */
  readonly relu: boolean;
}

export const DEFAULT_MLP_SIZES: readonly number[] = [512, 2048, 2048, 512];
const DEFAULT_SEED = 42;

/**
 * The weights of the MLP that buildMlpModel generates with the same options, drawn from a seeded
 * PRNG, uniform in ±1/sqrt(fan_in) so activations stay of order one.
 */
export function mlpLayers(options: MlpOptions = {}): MlpLayer[] {
  const sizes = options.sizes ?? DEFAULT_MLP_SIZES;
  if (sizes.length < 2 || sizes.some((s) => !Number.isInteger(s) || s <= 0)) {
    throw new RangeError(`MLP sizes must be at least two positive integers, got [${sizes.join(',')}]`);
  }
  const random = new SeededRandom(options.seed ?? DEFAULT_SEED);
  const layers: MlpLayer[] = [];
  for (let i = 0; i + 1 < sizes.length; i += 1) {
    const inFeatures = sizes[i]!;
    const outFeatures = sizes[i + 1]!;
    const bound = 1 / Math.sqrt(inFeatures);
    const weight = random.uniformFloat32(inFeatures * outFeatures, -bound, bound);
    const bias = random.uniformFloat32(outFeatures, -bound, bound);
    layers.push({ inFeatures, outFeatures, weight, bias, relu: i + 2 < sizes.length });
  }
  return layers;
}

/**
 * An FP32 multi-layer perceptron: input "input" [-1, sizes[0]], MatMul + Add (+ Relu except after
 * the last layer) per layer, output "output" [-1, sizes[last]]. With the default sizes it is about
 * 25 MB. Deterministic: the same options give the same bytes.
 */
export function buildMlpModel(options: MlpOptions = {}): BuiltModel {
  const layers = mlpLayers(options);
  const inputs: ModelTensorSpec[] = [{ name: 'input', datatype: 'FP32', shape: [-1, layers[0]!.inFeatures] }];
  const outputs: ModelTensorSpec[] = [
    { name: 'output', datatype: 'FP32', shape: [-1, layers[layers.length - 1]!.outFeatures] },
  ];
  const nodes: onnx.INodeProto[] = [];
  const initializers: onnx.ITensorProto[] = [];
  let current = 'input';
  layers.forEach((layer, i) => {
    const last = i === layers.length - 1;
    initializers.push(floatInitializer(`fc${i}.weight`, [layer.inFeatures, layer.outFeatures], layer.weight));
    initializers.push(floatInitializer(`fc${i}.bias`, [layer.outFeatures], layer.bias));
    nodes.push(node('MatMul', [current, `fc${i}.weight`], [`fc${i}.matmul`], `fc${i}_matmul`));
    const added = last ? 'output' : `fc${i}.add`;
    nodes.push(node('Add', [`fc${i}.matmul`, `fc${i}.bias`], [added], `fc${i}_add`));
    current = added;
    if (layer.relu) {
      nodes.push(node('Relu', [added], [`fc${i}.relu`], `fc${i}_relu`));
      current = `fc${i}.relu`;
    }
  });
  return encodeModel(options.name ?? 'mlp', { nodes, initializers, inputs, outputs });
}
