import type { onnx } from 'onnx-proto';
import {
  type BuiltModel,
  encodeModel,
  floatInitializer,
  int32Initializer,
  int8Initializer,
  intAttribute,
  intsAttribute,
  type ModelTensorSpec,
  node,
  ONNX_ELEM_TYPE,
  uint8Initializer,
} from './onnx-graph';
import { SeededRandom } from './prng';

/**
 * The ways ONNX spells a quantized model, each named for its operator: QuantizeLinear/DequantizeLinear
 * pairs around float operators ("qdq"), the integer operators with float rescaling around them
 * (MatMulInteger, ConvInteger), the quantized-linear operators (QLinearMatMul, QLinearConv), and a
 * dynamically quantized activation alone (DynamicQuantizeLinear).
 */
export type QuantizedForm =
  'qdq' | 'matmul-integer' | 'qlinear-matmul' | 'qlinear-conv' | 'conv-integer' | 'dynamic-quantize-linear';

export const QUANTIZED_FORMS: readonly QuantizedForm[] = [
  'qdq',
  'matmul-integer',
  'qlinear-matmul',
  'qlinear-conv',
  'conv-integer',
  'dynamic-quantize-linear',
];

/** The float computation a quantized form's model stands for, and the float weights it quantizes. */
export interface QuantizedFormReference {
  /** Row-major [in, out] for a dense form, [out, in, 3, 3] for a conv form; none for dynamic-quantize-linear. */
  readonly weight?: Float32Array;
  /** Per output feature or channel; none where the model adds no bias. */
  readonly bias?: Float32Array;
  /** The float output of a row-major batch of `batch` inputs, which the model's output approximates. */
  forward(input: Float32Array, batch: number): Float32Array;
}

type Graph = Parameters<typeof encodeModel>[1];

const SEED = 42;
/** The dense forms map [-1, 64] to [-1, 32]; the conv forms [-1, 3, 16, 16] to [-1, 8, 16, 16] (3×3, pads 1). */
const DENSE_IN = 64;
const DENSE_OUT = 32;
const CONV_IN = 3;
const CONV_OUT = 8;
const CONV_SIZE = 16;
const KERNEL = 3;
const DENSE_INPUT: ModelTensorSpec = { name: 'input', datatype: 'FP32', shape: [-1, DENSE_IN] };
const CONV_INPUT: ModelTensorSpec = { name: 'input', datatype: 'FP32', shape: [-1, CONV_IN, CONV_SIZE, CONV_SIZE] };
const CONV_ATTRIBUTES = [intsAttribute('kernel_shape', [KERNEL, KERNEL]), intsAttribute('pads', [1, 1, 1, 1])];
/** A static activation quantization for inputs in [-1, 1]: uint8 with zero point 128 covers [-128/127, 1]. */
const INPUT_SCALE = Math.fround(1 / 127);
const INPUT_ZERO_POINT = 128;
/**
 * Int8 weights that meet uint8 activations keep to 7 bits ([-63, 63]), as onnxruntime's
 * quantizer's reduce_range does: the u8s8 kernels of x86 CPUs without VNNI add pairs of products
 * in int16, which 255 · 127 · 2 would overflow.
 */
const INT8_WEIGHT_MAX = 63;
/** Uint8 weights around zero point 128 use [1, 255]. */
const UINT8_WEIGHT_MAX = 127;

/**
 * A small model in one of ONNX's quantized forms, for checking that a serving system loads and runs
 * it: one FP32 input "input" and one FP32 output "output", both with a dynamic batch dimension, only
 * opset 17's default-domain operators, and seeded weights quantized so that on inputs uniform in
 * [-1, 1] the output is within 1.5% (relative L2) of quantizedFormReference(form)'s float one.
 *
 * - "qdq": QuantizeLinear/DequantizeLinear of the input (uint8, static) and a DequantizeLinear of
 *   int8 weights (per output column, axis 1) feed a float MatMul + Add, [-1, 64] -> [-1, 32].
 * - "matmul-integer": DynamicQuantizeLinear, MatMulInteger (uint8 × int8, an int8 zero point per
 *   column), Cast, Mul by input scale × column scale, Add, [-1, 64] -> [-1, 32].
 * - "qlinear-matmul": QuantizeLinear, QLinearMatMul (uint8 × uint8, per-tensor, uint8 output),
 *   DequantizeLinear, [-1, 64] -> [-1, 32], no bias.
 * - "qlinear-conv": QuantizeLinear, QLinearConv 3×3 pads 1 (uint8 × int8 with a scale per output
 *   channel, int32 bias, uint8 output), DequantizeLinear, [-1, 3, 16, 16] -> [-1, 8, 16, 16].
 * - "conv-integer": DynamicQuantizeLinear, ConvInteger 3×3 pads 1 (uint8 × uint8, per-tensor zero
 *   point), Cast, Mul by input scale × channel scale, Add, [-1, 3, 16, 16] -> [-1, 8, 16, 16].
 * - "dynamic-quantize-linear": DynamicQuantizeLinear then DequantizeLinear, a uint8 round trip of
 *   the input, [-1, 64] -> [-1, 64].
 *
 * The dynamic forms quantize with one scale for the whole batch, so a row's output depends
 * slightly on the rows batched with it. Deterministic: each form always gives the same bytes.
 */
export function buildQuantizedFormModel(form: QuantizedForm): BuiltModel {
  return encodeModel(`quantized-${form}`, quantizedGraph(form));
}

/** The float weights and computation that buildQuantizedFormModel(form) quantizes. */
export function quantizedFormReference(form: QuantizedForm): QuantizedFormReference {
  switch (form) {
    case 'qdq':
    case 'matmul-integer': {
      const { weight, bias } = denseWeights();
      return { weight, bias, forward: (input, batch) => dense(input, batch, weight, bias) };
    }
    case 'qlinear-matmul': {
      const { weight } = denseWeights();
      return { weight, forward: (input, batch) => dense(input, batch, weight, undefined) };
    }
    case 'qlinear-conv':
    case 'conv-integer': {
      const { weight, bias } = convWeights();
      return { weight, bias, forward: (input, batch) => conv3x3(input, batch, weight, bias) };
    }
    case 'dynamic-quantize-linear':
      return { forward: (input) => Float32Array.from(input) };
  }
}

function quantizedGraph(form: QuantizedForm): Graph {
  switch (form) {
    case 'qdq':
      return qdqGraph();
    case 'matmul-integer':
      return matMulIntegerGraph();
    case 'qlinear-matmul':
      return qLinearMatMulGraph();
    case 'qlinear-conv':
      return qLinearConvGraph();
    case 'conv-integer':
      return convIntegerGraph();
    case 'dynamic-quantize-linear':
      return dynamicQuantizeLinearGraph();
  }
}

function qdqGraph(): Graph {
  const { weight, bias } = denseWeights();
  const quantized = quantizeSymmetric(weight, DENSE_OUT, (i) => i % DENSE_OUT, INT8_WEIGHT_MAX);
  return {
    nodes: [
      node('QuantizeLinear', ['input', 'input.scale', 'input.zero_point'], ['input.quantized'], 'input_quantize'),
      node(
        'DequantizeLinear',
        ['input.quantized', 'input.scale', 'input.zero_point'],
        ['input.dequantized'],
        'input_dequantize',
      ),
      node(
        'DequantizeLinear',
        ['weight.quantized', 'weight.scale', 'weight.zero_point'],
        ['weight'],
        'weight_dequantize',
        [intAttribute('axis', 1)],
      ),
      node('MatMul', ['input.dequantized', 'weight'], ['matmul'], 'matmul'),
      node('Add', ['matmul', 'bias'], ['output'], 'add'),
    ],
    initializers: [
      ...staticInputInitializers(),
      int8Initializer('weight.quantized', [DENSE_IN, DENSE_OUT], Int8Array.from(quantized.values)),
      floatInitializer('weight.scale', [DENSE_OUT], quantized.scales),
      int8Initializer('weight.zero_point', [DENSE_OUT], new Int8Array(DENSE_OUT)),
      floatInitializer('bias', [DENSE_OUT], bias),
    ],
    inputs: [DENSE_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, DENSE_OUT] }],
  };
}

function matMulIntegerGraph(): Graph {
  const { weight, bias } = denseWeights();
  const quantized = quantizeSymmetric(weight, DENSE_OUT, (i) => i % DENSE_OUT, INT8_WEIGHT_MAX);
  return {
    nodes: [
      node(
        'DynamicQuantizeLinear',
        ['input'],
        ['input.quantized', 'input.scale', 'input.zero_point'],
        'input_quantize',
      ),
      node(
        'MatMulInteger',
        ['input.quantized', 'weight.quantized', 'input.zero_point', 'weight.zero_point'],
        ['matmul.int32'],
        'matmul_integer',
      ),
      ...rescaleNodes('matmul'),
      node('Add', ['matmul', 'bias'], ['output'], 'add'),
    ],
    initializers: [
      int8Initializer('weight.quantized', [DENSE_IN, DENSE_OUT], Int8Array.from(quantized.values)),
      int8Initializer('weight.zero_point', [DENSE_OUT], new Int8Array(DENSE_OUT)),
      floatInitializer('weight.scale', [DENSE_OUT], quantized.scales),
      floatInitializer('bias', [DENSE_OUT], bias),
    ],
    inputs: [DENSE_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, DENSE_OUT] }],
  };
}

function qLinearMatMulGraph(): Graph {
  const { weight } = denseWeights();
  const quantized = quantizeAsymmetric(weight);
  const outputScale = staticOutputScale(weight, undefined, DENSE_OUT, (i) => i % DENSE_OUT);
  return {
    nodes: [
      node('QuantizeLinear', ['input', 'input.scale', 'input.zero_point'], ['input.quantized'], 'input_quantize'),
      node(
        'QLinearMatMul',
        [
          'input.quantized',
          'input.scale',
          'input.zero_point',
          'weight.quantized',
          'weight.scale',
          'weight.zero_point',
          'output.scale',
          'output.zero_point',
        ],
        ['output.quantized'],
        'qlinear_matmul',
      ),
      node(
        'DequantizeLinear',
        ['output.quantized', 'output.scale', 'output.zero_point'],
        ['output'],
        'output_dequantize',
      ),
    ],
    initializers: [
      ...staticInputInitializers(),
      uint8Initializer('weight.quantized', [DENSE_IN, DENSE_OUT], quantized.values),
      floatInitializer('weight.scale', [], Float32Array.of(quantized.scale)),
      uint8Initializer('weight.zero_point', [], Uint8Array.of(quantized.zeroPoint)),
      floatInitializer('output.scale', [], Float32Array.of(outputScale)),
      uint8Initializer('output.zero_point', [], Uint8Array.of(128)),
    ],
    inputs: [DENSE_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, DENSE_OUT] }],
  };
}

function qLinearConvGraph(): Graph {
  const { weight, bias } = convWeights();
  const channelOf = (i: number) => Math.floor(i / (CONV_IN * KERNEL * KERNEL));
  const quantized = quantizeSymmetric(weight, CONV_OUT, channelOf, INT8_WEIGHT_MAX);
  const outputScale = staticOutputScale(weight, bias, CONV_OUT, channelOf);
  // QLinearConv adds its bias to the int32 accumulator, whose scale is input scale × channel scale.
  const quantizedBias = Int32Array.from(bias, (b, c) => Math.round(b / (INPUT_SCALE * quantized.scales[c]!)));
  return {
    nodes: [
      node('QuantizeLinear', ['input', 'input.scale', 'input.zero_point'], ['input.quantized'], 'input_quantize'),
      node(
        'QLinearConv',
        [
          'input.quantized',
          'input.scale',
          'input.zero_point',
          'weight.quantized',
          'weight.scale',
          'weight.zero_point',
          'output.scale',
          'output.zero_point',
          'bias.quantized',
        ],
        ['output.quantized'],
        'qlinear_conv',
        CONV_ATTRIBUTES,
      ),
      node(
        'DequantizeLinear',
        ['output.quantized', 'output.scale', 'output.zero_point'],
        ['output'],
        'output_dequantize',
      ),
    ],
    initializers: [
      ...staticInputInitializers(),
      int8Initializer('weight.quantized', [CONV_OUT, CONV_IN, KERNEL, KERNEL], Int8Array.from(quantized.values)),
      floatInitializer('weight.scale', [CONV_OUT], quantized.scales),
      int8Initializer('weight.zero_point', [CONV_OUT], new Int8Array(CONV_OUT)),
      floatInitializer('output.scale', [], Float32Array.of(outputScale)),
      uint8Initializer('output.zero_point', [], Uint8Array.of(128)),
      int32Initializer('bias.quantized', [CONV_OUT], quantizedBias),
    ],
    inputs: [CONV_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, CONV_OUT, CONV_SIZE, CONV_SIZE] }],
  };
}

function convIntegerGraph(): Graph {
  const { weight, bias } = convWeights();
  // onnxruntime's ConvInteger takes only a per-tensor weight zero point: uint8 weights around 128,
  // each output channel with its own scale, applied after the integer convolution.
  const quantized = quantizeSymmetric(
    weight,
    CONV_OUT,
    (i) => Math.floor(i / (CONV_IN * KERNEL * KERNEL)),
    UINT8_WEIGHT_MAX,
  );
  return {
    nodes: [
      node(
        'DynamicQuantizeLinear',
        ['input'],
        ['input.quantized', 'input.scale', 'input.zero_point'],
        'input_quantize',
      ),
      node(
        'ConvInteger',
        ['input.quantized', 'weight.quantized', 'input.zero_point', 'weight.zero_point'],
        ['conv.int32'],
        'conv_integer',
        CONV_ATTRIBUTES,
      ),
      ...rescaleNodes('conv'),
      node('Add', ['conv', 'bias'], ['output'], 'add'),
    ],
    initializers: [
      uint8Initializer(
        'weight.quantized',
        [CONV_OUT, CONV_IN, KERNEL, KERNEL],
        Uint8Array.from(quantized.values, (q) => q + 128),
      ),
      uint8Initializer('weight.zero_point', [], Uint8Array.of(128)),
      floatInitializer('weight.scale', [CONV_OUT, 1, 1], quantized.scales),
      floatInitializer('bias', [CONV_OUT, 1, 1], bias),
    ],
    inputs: [CONV_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, CONV_OUT, CONV_SIZE, CONV_SIZE] }],
  };
}

function dynamicQuantizeLinearGraph(): Graph {
  return {
    nodes: [
      node(
        'DynamicQuantizeLinear',
        ['input'],
        ['input.quantized', 'input.scale', 'input.zero_point'],
        'input_quantize',
      ),
      node('DequantizeLinear', ['input.quantized', 'input.scale', 'input.zero_point'], ['output'], 'input_dequantize'),
    ],
    initializers: [],
    inputs: [DENSE_INPUT],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, DENSE_IN] }],
  };
}

/** The static uint8 quantization of "input" in [-1, 1]. */
function staticInputInitializers(): onnx.ITensorProto[] {
  return [
    floatInitializer('input.scale', [], Float32Array.of(INPUT_SCALE)),
    uint8Initializer('input.zero_point', [], Uint8Array.of(INPUT_ZERO_POINT)),
  ];
}

/** `${prefix}.int32`, the integer operator's output, back to float: times input scale × weight scale, as `${prefix}`. */
function rescaleNodes(prefix: string): onnx.INodeProto[] {
  return [
    node('Cast', [`${prefix}.int32`], [`${prefix}.float`], `${prefix}_cast`, [intAttribute('to', ONNX_ELEM_TYPE.FP32)]),
    node('Mul', ['input.scale', 'weight.scale'], [`${prefix}.scale`], `${prefix}_scale`),
    node('Mul', [`${prefix}.float`, `${prefix}.scale`], [prefix], `${prefix}_rescale`),
  ];
}

/** The dense forms' float weights: row-major [64, 32] and [32], uniform in ±1/sqrt(fan_in). */
function denseWeights(): { weight: Float32Array; bias: Float32Array } {
  const random = new SeededRandom(SEED);
  const bound = 1 / Math.sqrt(DENSE_IN);
  return {
    weight: random.uniformFloat32(DENSE_IN * DENSE_OUT, -bound, bound),
    bias: random.uniformFloat32(DENSE_OUT, -bound, bound),
  };
}

/** The conv forms' float weights: row-major [8, 3, 3, 3] and [8], uniform in ±1/sqrt(fan_in). */
function convWeights(): { weight: Float32Array; bias: Float32Array } {
  const random = new SeededRandom(SEED);
  const fanIn = CONV_IN * KERNEL * KERNEL;
  const bound = 1 / Math.sqrt(fanIn);
  return {
    weight: random.uniformFloat32(CONV_OUT * fanIn, -bound, bound),
    bias: random.uniformFloat32(CONV_OUT, -bound, bound),
  };
}

/** Symmetric per-channel quantization: value i becomes round(w / scale) in [-max, max], with scale = max |w| of its channel / max. */
function quantizeSymmetric(
  weight: Float32Array,
  channels: number,
  channelOf: (i: number) => number,
  max: number,
): { values: number[]; scales: Float32Array } {
  const scales = new Float32Array(channels);
  weight.forEach((w, i) => {
    const c = channelOf(i);
    scales[c] = Math.max(scales[c]!, Math.abs(w));
  });
  scales.forEach((s, c) => (scales[c] = s > 0 ? s / max : 1));
  const values = Array.from(weight, (w, i) => Math.max(-max, Math.min(max, Math.round(w / scales[channelOf(i)]!))));
  return { values, scales };
}

/** Asymmetric per-tensor uint8 quantization over [min(w, 0), max(w, 0)]. */
function quantizeAsymmetric(weight: Float32Array): { values: Uint8Array; scale: number; zeroPoint: number } {
  let low = 0;
  let high = 0;
  for (const w of weight) {
    low = Math.min(low, w);
    high = Math.max(high, w);
  }
  const scale = Math.fround(high > low ? (high - low) / 255 : 1);
  const zeroPoint = Math.round(-low / scale);
  const values = Uint8Array.from(weight, (w) => Math.max(0, Math.min(255, Math.round(w / scale) + zeroPoint)));
  return { values, scale, zeroPoint };
}

/**
 * The scale of a uint8 output with zero point 128 for inputs uniform in [-1, 1] (variance 1/3): it
 * covers |bias| plus 4 standard deviations of the widest channel, so saturation is rare.
 */
function staticOutputScale(
  weight: Float32Array,
  bias: Float32Array | undefined,
  channels: number,
  channelOf: (i: number) => number,
): number {
  const squares = new Float64Array(channels);
  weight.forEach((w, i) => (squares[channelOf(i)]! += w * w));
  let bound = 0;
  squares.forEach((s, c) => (bound = Math.max(bound, Math.abs(bias?.[c] ?? 0) + 4 * Math.sqrt(s / 3))));
  return Math.fround((2 * bound) / 255);
}

/** y = x · W (+ b) for a row-major x [batch, 64] and W [64, 32]. */
function dense(x: Float32Array, batch: number, weight: Float32Array, bias: Float32Array | undefined): Float32Array {
  const y = new Float32Array(batch * DENSE_OUT);
  for (let r = 0; r < batch; r += 1) {
    for (let o = 0; o < DENSE_OUT; o += 1) {
      let sum = bias?.[o] ?? 0;
      for (let i = 0; i < DENSE_IN; i += 1) sum += x[r * DENSE_IN + i]! * weight[i * DENSE_OUT + o]!;
      y[r * DENSE_OUT + o] = sum;
    }
  }
  return y;
}

/** A 3×3 convolution, stride 1, zero padding 1, of x [batch, 3, 16, 16] with W [8, 3, 3, 3] plus b. */
function conv3x3(x: Float32Array, batch: number, weight: Float32Array, bias: Float32Array): Float32Array {
  const plane = CONV_SIZE * CONV_SIZE;
  const y = new Float32Array(batch * CONV_OUT * plane);
  for (let n = 0; n < batch; n += 1) {
    for (let o = 0; o < CONV_OUT; o += 1) {
      for (let row = 0; row < CONV_SIZE; row += 1) {
        for (let col = 0; col < CONV_SIZE; col += 1) {
          let sum = bias[o]!;
          for (let c = 0; c < CONV_IN; c += 1) {
            for (let kr = 0; kr < KERNEL; kr += 1) {
              const r = row + kr - 1;
              if (r < 0 || r >= CONV_SIZE) continue;
              for (let kc = 0; kc < KERNEL; kc += 1) {
                const q = col + kc - 1;
                if (q < 0 || q >= CONV_SIZE) continue;
                sum +=
                  x[(n * CONV_IN + c) * plane + r * CONV_SIZE + q]! *
                  weight[((o * CONV_IN + c) * KERNEL + kr) * KERNEL + kc]!;
              }
            }
          }
          y[(n * CONV_OUT + o) * plane + row * CONV_SIZE + col] = sum;
        }
      }
    }
  }
  return y;
}
