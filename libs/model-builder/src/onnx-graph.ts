import type { MessageInitShape } from '@bufbuild/protobuf';
import type { BatchingSchema, ProcessingSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { onnx } from 'onnx-proto';
import { endianness } from 'node:os';

/** KServe names of the datatypes generated models can declare. */
export type ModelDatatype =
  | 'BOOL'
  | 'UINT8'
  | 'UINT16'
  | 'UINT32'
  | 'UINT64'
  | 'INT8'
  | 'INT16'
  | 'INT32'
  | 'INT64'
  | 'FP16'
  | 'FP32'
  | 'FP64'
  | 'BYTES'
  | 'BF16';

/** A model input or output: name, KServe datatype and shape, -1 for the dynamic batch dimension. */
export interface ModelTensorSpec {
  readonly name: string;
  readonly datatype: ModelDatatype;
  readonly shape: readonly number[];
  /** The symbolic names of its dynamic dimensions, by position; unnamed ones are "batch". */
  readonly dimNames?: readonly (string | undefined)[];
}

/** The pre- and post-processing a model is registered with, as plain data (the registry's Processing). */
export type ProcessingInit = MessageInitShape<typeof ProcessingSchema>;

/** How the batcher queues and batches a model's requests, as plain data (the registry's Batching). */
export type BatchingInit = MessageInitShape<typeof BatchingSchema>;

/** A generated model: its name, the serialized ONNX ModelProto, and its signature. */
export interface BuiltModel {
  readonly name: string;
  /** The ONNX model file's bytes. */
  readonly bytes: Uint8Array;
  readonly inputs: readonly ModelTensorSpec[];
  readonly outputs: readonly ModelTensorSpec[];
  /** The processing to register the model with, when it has one. */
  readonly processing?: ProcessingInit;
  /** The batching to register the model with, when it declares one. */
  readonly batching?: BatchingInit;
}

/** The ONNX opset the generated models import. */
export const ONNX_OPSET = 17;
/** ONNX IR version 8 goes with opset 17. */
const IR_VERSION = 8;

/** ONNX TensorProto.DataType of each datatype. */
export const ONNX_ELEM_TYPE: Readonly<Record<ModelDatatype, number>> = {
  FP32: 1,
  UINT8: 2,
  INT8: 3,
  UINT16: 4,
  INT16: 5,
  INT32: 6,
  INT64: 7,
  BYTES: 8,
  BOOL: 9,
  FP16: 10,
  FP64: 11,
  UINT32: 12,
  UINT64: 13,
  BF16: 16,
};

export function valueInfo(spec: ModelTensorSpec): onnx.IValueInfoProto {
  return {
    name: spec.name,
    type: {
      tensorType: {
        elemType: ONNX_ELEM_TYPE[spec.datatype],
        shape: {
          dim: spec.shape.map((d, i) => (d < 0 ? { dimParam: spec.dimNames?.[i] ?? 'batch' } : { dimValue: d })),
        },
      },
    },
  };
}

/** A float32 initializer with its bytes stored little-endian as ONNX requires. */
export function floatInitializer(name: string, dims: readonly number[], values: Float32Array): onnx.ITensorProto {
  return { name, dims: [...dims], dataType: ONNX_ELEM_TYPE.FP32, rawData: littleEndianBytes(values) };
}

export function int64Initializer(name: string, dims: readonly number[], values: BigInt64Array): onnx.ITensorProto {
  return { name, dims: [...dims], dataType: ONNX_ELEM_TYPE.INT64, rawData: littleEndianBytes(values) };
}

export function int32Initializer(name: string, dims: readonly number[], values: Int32Array): onnx.ITensorProto {
  return { name, dims: [...dims], dataType: ONNX_ELEM_TYPE.INT32, rawData: littleEndianBytes(values) };
}

/** An int8 initializer, as quantized weights and their zero points are stored. */
export function int8Initializer(name: string, dims: readonly number[], values: Int8Array): onnx.ITensorProto {
  return { name, dims: [...dims], dataType: ONNX_ELEM_TYPE.INT8, rawData: littleEndianBytes(values) };
}

/** A uint8 initializer, as quantized weights and their zero points are stored. */
export function uint8Initializer(name: string, dims: readonly number[], values: Uint8Array): onnx.ITensorProto {
  return { name, dims: [...dims], dataType: ONNX_ELEM_TYPE.UINT8, rawData: littleEndianBytes(values) };
}

/** A node's INT attribute, e.g. an axis. */
export function intAttribute(name: string, value: number): onnx.IAttributeProto {
  return { name, type: onnx.AttributeProto.AttributeType.INT, i: value };
}

/** A node's INTS attribute, e.g. a Conv's kernel_shape. */
export function intsAttribute(name: string, values: readonly number[]): onnx.IAttributeProto {
  return { name, type: onnx.AttributeProto.AttributeType.INTS, ints: [...values] };
}

export function node(
  opType: string,
  inputs: string[],
  outputs: string[],
  name: string,
  attribute?: onnx.IAttributeProto[],
): onnx.INodeProto {
  return { opType, input: inputs, output: outputs, name, ...(attribute !== undefined && { attribute }) };
}

/** Serializes a graph into an ONNX model; the same graph always gives the same bytes. */
export function encodeModel(
  name: string,
  graph: {
    nodes: onnx.INodeProto[];
    initializers: onnx.ITensorProto[];
    inputs: readonly ModelTensorSpec[];
    outputs: readonly ModelTensorSpec[];
  },
): BuiltModel {
  const model = onnx.ModelProto.create({
    irVersion: IR_VERSION,
    opsetImport: [{ domain: '', version: ONNX_OPSET }],
    producerName: 'infermesh-model-builder',
    producerVersion: '1',
    graph: {
      name,
      node: graph.nodes,
      initializer: graph.initializers,
      input: graph.inputs.map(valueInfo),
      output: graph.outputs.map(valueInfo),
    },
  });
  const encoded = onnx.ModelProto.encode(model).finish();
  // A copy of its own: protobufjs may hand back a slice of a shared pool.
  return { name, bytes: new Uint8Array(encoded), inputs: graph.inputs, outputs: graph.outputs };
}

function littleEndianBytes(values: Float32Array | BigInt64Array | Int32Array | Int8Array | Uint8Array): Uint8Array {
  const bytes = new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
  if (endianness() === 'BE') {
    const width = values.BYTES_PER_ELEMENT;
    for (let i = 0; i < bytes.length; i += width) bytes.subarray(i, i + width).reverse();
  }
  return bytes;
}
