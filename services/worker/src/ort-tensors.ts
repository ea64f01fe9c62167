import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeFromOrt, datatypeName, decodeBytesElements, encodeBytesElements } from '@infermesh/tensors';

type TypedArrayConstructor =
  | Int8ArrayConstructor
  | Uint8ArrayConstructor
  | Int16ArrayConstructor
  | Uint16ArrayConstructor
  | Int32ArrayConstructor
  | Uint32ArrayConstructor
  | Float32ArrayConstructor
  | Float64ArrayConstructor
  | BigInt64ArrayConstructor
  | BigUint64ArrayConstructor;

/** The typed array onnxruntime-node takes for each fixed-size datatype (host byte order = little-endian). */
const ARRAYS: Partial<Record<DataType, { ort: string; array: TypedArrayConstructor }>> = {
  [DataType.BOOL]: { ort: 'bool', array: Uint8Array },
  [DataType.UINT8]: { ort: 'uint8', array: Uint8Array },
  [DataType.INT8]: { ort: 'int8', array: Int8Array },
  [DataType.UINT16]: { ort: 'uint16', array: Uint16Array },
  [DataType.INT16]: { ort: 'int16', array: Int16Array },
  [DataType.UINT32]: { ort: 'uint32', array: Uint32Array },
  [DataType.INT32]: { ort: 'int32', array: Int32Array },
  [DataType.UINT64]: { ort: 'uint64', array: BigUint64Array },
  [DataType.INT64]: { ort: 'int64', array: BigInt64Array },
  [DataType.FP16]: { ort: 'float16', array: Uint16Array },
  [DataType.FP32]: { ort: 'float32', array: Float32Array },
  [DataType.FP64]: { ort: 'float64', array: Float64Array },
};

/**
 * A tensor as it crosses into an execution thread and back (see execution-thread.js): the
 * onnxruntime type name, the dimensions, and the data as one ArrayBuffer holding exactly the
 * tensor's little-endian bytes (transferable) or, for strings, the elements.
 */
export interface WireTensor {
  name: string;
  type: string;
  dims: number[];
  data: ArrayBuffer | string[];
}

/**
 * An internal tensor (raw little-endian bytes) as a wire tensor. The bytes are copied once into
 * an ArrayBuffer of their own (a memcpy: the caller's buffer stays intact, the copy is aligned and
 * can be transferred). BYTES elements become UTF-8 strings. Throws INVALID_ARGUMENT
 * (INVALID_TENSOR) for data that does not fit the shape and for datatypes onnxruntime-node cannot
 * hold (BF16).
 */
export function toWireTensor(tensor: Tensor): WireTensor {
  const dims = tensor.shape.map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  if (tensor.datatype === DataType.BYTES) {
    const elements = decodeBytesElements(tensor.data);
    if (elements === undefined || elements.length !== count) {
      throw invalid(`tensor "${tensor.name}": BYTES data does not hold ${count} length-prefixed elements`);
    }
    return { name: tensor.name, type: 'string', dims, data: elements.map((e) => e.toString('utf8')) };
  }
  const kind = ARRAYS[tensor.datatype];
  if (kind === undefined) {
    throw invalid(`tensor "${tensor.name}": datatype ${datatypeName(tensor.datatype)} is not supported by the worker's runtime`);
  }
  const size = kind.array.BYTES_PER_ELEMENT;
  if (tensor.data.byteLength !== count * size) {
    throw invalid(`tensor "${tensor.name}" has ${tensor.data.byteLength} bytes of data but its shape needs ${count * size}`);
  }
  return { name: tensor.name, type: kind.ort, dims, data: new Uint8Array(tensor.data).buffer };
}

/** A wire tensor from an execution thread as an internal tensor: its bytes, little-endian, and its shape. */
export function fromWireTensor(wire: WireTensor): Tensor {
  const { name } = wire;
  const datatype = datatypeFromOrt(wire.type);
  if (datatype === undefined) throw new RpcError(status.INTERNAL, `output "${name}" has type ${wire.type}, which has no KServe datatype`, { reason: 'INTERNAL' });
  const shape = wire.dims.map((d) => BigInt(d));
  if (Array.isArray(wire.data)) {
    return create(TensorSchema, { name, datatype, shape, data: encodeBytesElements(wire.data.map((s) => Buffer.from(s, 'utf8'))) });
  }
  return create(TensorSchema, { name, datatype, shape, data: new Uint8Array(wire.data) });
}

/** The buffers of wire tensors, to transfer rather than copy. */
export function transferables(tensors: readonly WireTensor[]): ArrayBuffer[] {
  return tensors.flatMap((t) => (Array.isArray(t.data) ? [] : [t.data]));
}

function invalid(message: string): RpcError {
  return RpcError.invalidArgument(message, 'INVALID_TENSOR');
}
