import { onnx } from 'onnx-proto';
import {
  type BuiltModel,
  encodeModel,
  floatInitializer,
  int64Initializer,
  type ModelTensorSpec,
  node,
  ONNX_ELEM_TYPE,
  valueInfo,
} from './onnx-graph';

/** The sample rates the sample-rate model accepts, as a voice-activity model does. */
export const SAMPLE_RATES: readonly number[] = [8000, 16000];

/** An index far beyond any audio length: the sample-rate model's else-branch gathers it and fails. */
const OUT_OF_RANGE_INDEX = 1n << 40n;

const AUDIO: ModelTensorSpec = { name: 'audio', datatype: 'FP32', shape: [-1, -1], dimNames: ['batch', 'samples'] };

/**
 * A model that needs a minimum input length, as a voice-activity model does: "audio" FP32
 * [batch, samples] is padded by one sample at each end in reflect mode (Pad mode "reflect"), which
 * onnxruntime refuses at run time for fewer than 2 samples. Outputs "padded" [batch, samples + 2]
 * and "energy" [batch, 1], the sum of the padded samples' squares. It batches (every dimension
 * before the samples is dynamic), so a synthetic warm-up runs it on [1, 1] and fails.
 */
export function buildReflectPadModel(name = 'reflect-pad'): BuiltModel {
  return encodeModel(name, {
    nodes: [
      node('Pad', ['audio', 'pads'], ['padded'], 'pad', [
        { name: 'mode', type: onnx.AttributeProto.AttributeType.STRING, s: Buffer.from('reflect') },
      ]),
      node('ReduceSumSquare', ['padded'], ['energy'], 'energy', [
        { name: 'axes', type: onnx.AttributeProto.AttributeType.INTS, ints: [1] },
        { name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 1 },
      ]),
    ],
    initializers: [int64Initializer('pads', [4], BigInt64Array.of(0n, 1n, 0n, 1n))],
    inputs: [AUDIO],
    outputs: [
      { name: 'padded', datatype: 'FP32', shape: [-1, -1], dimNames: ['batch', 'padded_samples'] },
      { name: 'energy', datatype: 'FP32', shape: [-1, 1] },
    ],
  });
}

/**
 * A model that needs an input's value in a set, as a voice-activity model's sample rate: "audio" FP32
 * [batch, samples] and "sr" INT64 [1]. An If on `sr` being 8000 or 16000 scales the audio by
 * sr / 16000 ("scaled", [batch, samples]); any other rate takes the else-branch, a Gather of an index
 * far out of range, which onnxruntime fails at run time ("indices element out of data bounds"). A
 * synthetic warm-up gives sr 0 and fails. It does not batch ("sr" has no batch dimension).
 */
export function buildSampleRateModel(name = 'sample-rate'): BuiltModel {
  const graphAttribute = (attribute: string, graph: onnx.IGraphProto): onnx.IAttributeProto => ({
    name: attribute,
    type: onnx.AttributeProto.AttributeType.GRAPH,
    g: graph,
  });
  const branchOutput = (output: string) =>
    valueInfo({ name: output, datatype: 'FP32', shape: [-1, -1], dimNames: ['batch', `${output}_samples`] });
  // Both branches read the outer graph's values (audio, sr and the initializers) by name.
  const thenBranch: onnx.IGraphProto = {
    name: 'supported_rate',
    node: [
      node('Cast', ['sr'], ['sr_float'], 'sr_float', [
        { name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: ONNX_ELEM_TYPE.FP32 },
      ]),
      node('Div', ['sr_float', 'reference_rate'], ['ratio'], 'ratio'),
      node('Mul', ['audio', 'ratio'], ['then_scaled'], 'scale'),
    ],
    output: [branchOutput('then_scaled')],
  };
  const elseBranch: onnx.IGraphProto = {
    name: 'unsupported_rate',
    node: [
      node('Gather', ['audio', 'out_of_range'], ['else_scaled'], 'fail', [
        { name: 'axis', type: onnx.AttributeProto.AttributeType.INT, i: 1 },
      ]),
    ],
    output: [branchOutput('else_scaled')],
  };
  return encodeModel(name, {
    nodes: [
      node('Equal', ['sr', 'rate_8k'], ['is_8k'], 'is_8k'),
      node('Equal', ['sr', 'rate_16k'], ['is_16k'], 'is_16k'),
      node('Or', ['is_8k', 'is_16k'], ['supported'], 'supported'),
      node('If', ['supported'], ['scaled'], 'by_rate', [
        graphAttribute('then_branch', thenBranch),
        graphAttribute('else_branch', elseBranch),
      ]),
    ],
    initializers: [
      int64Initializer('rate_8k', [1], BigInt64Array.of(BigInt(SAMPLE_RATES[0]!))),
      int64Initializer('rate_16k', [1], BigInt64Array.of(BigInt(SAMPLE_RATES[1]!))),
      floatInitializer('reference_rate', [1], Float32Array.of(16000)),
      int64Initializer('out_of_range', [1], BigInt64Array.of(OUT_OF_RANGE_INDEX)),
    ],
    inputs: [AUDIO, { name: 'sr', datatype: 'INT64', shape: [1] }],
    outputs: [{ name: 'scaled', datatype: 'FP32', shape: [-1, -1], dimNames: ['batch', 'samples'] }],
  });
}
