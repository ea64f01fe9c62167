import type { onnx } from 'onnx-proto';
import type { MlpLayer } from './mlp-model';
import {
  type BuiltModel,
  encodeModel,
  floatInitializer,
  intAttribute,
  intsAttribute,
  type ModelTensorSpec,
  node,
} from './onnx-graph';
import { SeededRandom } from './prng';

export interface CnnOptions {
  /** Model name; default "cnn". */
  name?: string;
  /** PRNG seed of the weights; default 42. */
  seed?: number;
  /** Output channels of each 3×3 stride-2 convolution, in order; default [32, 64, 128]. */
  channels?: readonly number[];
  /** Classes the dense classifier scores; default 10. */
  classes?: number;
}

/** One 3×3 convolution (stride 2, pads 1) followed by Relu: `weight` is row-major [outChannels, inChannels, 3, 3]. */
export interface CnnConvLayer {
  readonly inChannels: number;
  readonly outChannels: number;
  readonly weight: Float32Array;
  readonly bias: Float32Array;
}

/** The CNN's weights: its convolutions, then the dense classifier on their pooled last channels. */
export interface CnnLayers {
  readonly convs: readonly CnnConvLayer[];
  /** Row-major [lastChannels, classes], no Relu. */
  readonly fc: MlpLayer;
}

/** The shape of one "input" image, NCHW without the batch: 3 channels, 48 rows, 192 columns. */
export const CNN_INPUT_SHAPE: readonly number[] = [3, 48, 192];
export const DEFAULT_CNN_CHANNELS: readonly number[] = [32, 64, 128];
export const DEFAULT_CNN_CLASSES = 10;
/** Every convolution's kernel size, stride and padding on each side. */
export const CNN_KERNEL = 3;
export const CNN_STRIDE = 2;
export const CNN_PAD = 1;
const DEFAULT_SEED = 42;
const BIAS_BOUND = 0.1;

/**
 * The weights of the CNN that buildCnnModel generates with the same options, drawn from a seeded
 * PRNG (conv0's weight and bias, conv1's, ..., then fc's). The weights are uniform in
 * ±sqrt(6/fan_in) (He's initialization for Relu) so that activations keep their scale from layer to
 * layer and the scores depend on the image, not only on the biases; biases are uniform in ±0.1.
 */
export function cnnLayers(options: CnnOptions = {}): CnnLayers {
  const channels = options.channels ?? DEFAULT_CNN_CHANNELS;
  const classes = options.classes ?? DEFAULT_CNN_CLASSES;
  if (channels.length === 0 || channels.some((c) => !Number.isInteger(c) || c <= 0)) {
    throw new RangeError(`CNN channels must be one or more positive integers, got [${channels.join(',')}]`);
  }
  if (!Number.isInteger(classes) || classes <= 0)
    throw new RangeError(`CNN classes must be a positive integer, got ${classes}`);
  const random = new SeededRandom(options.seed ?? DEFAULT_SEED);
  const convs: CnnConvLayer[] = [];
  let inChannels = CNN_INPUT_SHAPE[0]!;
  for (const outChannels of channels) {
    const fanIn = inChannels * CNN_KERNEL * CNN_KERNEL;
    const bound = Math.sqrt(6 / fanIn);
    const weight = random.uniformFloat32(outChannels * fanIn, -bound, bound);
    const bias = random.uniformFloat32(outChannels, -BIAS_BOUND, BIAS_BOUND);
    convs.push({ inChannels, outChannels, weight, bias });
    inChannels = outChannels;
  }
  const bound = Math.sqrt(6 / inChannels);
  const weight = random.uniformFloat32(inChannels * classes, -bound, bound);
  const bias = random.uniformFloat32(classes, -BIAS_BOUND, BIAS_BOUND);
  return { convs, fc: { inFeatures: inChannels, outFeatures: classes, weight, bias, relu: false } };
}

/**
 * An FP32 image classifier: input "input" [-1, 3, 48, 192] (NCHW), per entry of `channels` a 3×3
 * Conv (stride 2, pads 1, with bias) and Relu, then GlobalAveragePool, Flatten and a dense layer
 * (MatMul + Add) to output "scores" [-1, classes]. About 380 KB with the default options.
 * Deterministic: the same options give the same bytes.
 */
export function buildCnnModel(options: CnnOptions = {}): BuiltModel {
  const { convs, fc } = cnnLayers(options);
  const inputs: ModelTensorSpec[] = [{ name: 'input', datatype: 'FP32', shape: [-1, ...CNN_INPUT_SHAPE] }];
  const outputs: ModelTensorSpec[] = [{ name: 'scores', datatype: 'FP32', shape: [-1, fc.outFeatures] }];
  const nodes: onnx.INodeProto[] = [];
  const initializers: onnx.ITensorProto[] = [];
  const convAttributes = [
    intsAttribute('kernel_shape', [CNN_KERNEL, CNN_KERNEL]),
    intsAttribute('strides', [CNN_STRIDE, CNN_STRIDE]),
    intsAttribute('pads', [CNN_PAD, CNN_PAD, CNN_PAD, CNN_PAD]),
  ];
  let current = 'input';
  convs.forEach((conv, i) => {
    initializers.push(
      floatInitializer(`conv${i}.weight`, [conv.outChannels, conv.inChannels, CNN_KERNEL, CNN_KERNEL], conv.weight),
    );
    initializers.push(floatInitializer(`conv${i}.bias`, [conv.outChannels], conv.bias));
    nodes.push(
      node('Conv', [current, `conv${i}.weight`, `conv${i}.bias`], [`conv${i}.conv`], `conv${i}_conv`, convAttributes),
    );
    nodes.push(node('Relu', [`conv${i}.conv`], [`conv${i}.relu`], `conv${i}_relu`));
    current = `conv${i}.relu`;
  });
  initializers.push(floatInitializer('fc.weight', [fc.inFeatures, fc.outFeatures], fc.weight));
  initializers.push(floatInitializer('fc.bias', [fc.outFeatures], fc.bias));
  nodes.push(
    node('GlobalAveragePool', [current], ['pool'], 'pool'),
    node('Flatten', ['pool'], ['flatten'], 'flatten', [intAttribute('axis', 1)]),
    node('MatMul', ['flatten', 'fc.weight'], ['fc.matmul'], 'fc_matmul'),
    node('Add', ['fc.matmul', 'fc.bias'], ['scores'], 'fc_add'),
  );
  return encodeModel(options.name ?? 'cnn', { nodes, initializers, inputs, outputs });
}
