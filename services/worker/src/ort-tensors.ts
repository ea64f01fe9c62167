import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeFromOrt, datatypeName, decodeBytesElements, encodeBytesElements } from '@infermesh/tensors';
import { Tensor as OrtTensor } from 'onnxruntime-node';

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
 * An internal tensor (raw little-endian bytes) as an onnxruntime-node tensor. The bytes are viewed in
 * place when their offset suits the element size and copied otherwise. BYTES elements become UTF-8
 * strings. Throws INVALID_ARGUMENT (INVALID_TENSOR) for data that does not fit the shape and for
 * datatypes onnxruntime-node cannot hold (BF16).
 */
export function toOrtTensor(tensor: Tensor): OrtTensor {
  const dims = tensor.shape.map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  if (tensor.datatype === DataType.BYTES) {
    const elements = decodeBytesElements(tensor.data);
    if (elements === undefined || elements.length !== count) {
      throw invalid(`tensor "${tensor.name}": BYTES data does not hold ${count} length-prefixed elements`);
    }
    return new OrtTensor('string', elements.map((e) => e.toString('utf8')), dims);
  }
  const kind = ARRAYS[tensor.datatype];
  if (kind === undefined) {
    throw invalid(`tensor "${tensor.name}": datatype ${datatypeName(tensor.datatype)} is not supported by the worker's runtime`);
  }
  const size = kind.array.BYTES_PER_ELEMENT;
  if (tensor.data.byteLength !== count * size) {
    throw invalid(`tensor "${tensor.name}" has ${tensor.data.byteLength} bytes of data but its shape needs ${count * size}`);
  }
  const data = typedView(kind.array, tensor.data);
  const ortTensor = new OrtTensor(kind.ort as 'float32', data as Float32Array, dims);
  if (tensor.datatype === DataType.FP16 && ortTensor.data !== data) {
    // Where Float16Array exists, onnxruntime-common wraps the bits in one, which the native binding
    // cannot read ("not enough space"); it reads the `data` property, so hand it the bits themselves.
    Object.defineProperty(ortTensor, 'data', { value: data });
  }
  return ortTensor;
}

/** An onnxruntime-node tensor as an internal tensor: its bytes, little-endian, and its shape. */
export function fromOrtTensor(name: string, tensor: OrtTensor): Tensor {
  const datatype = datatypeFromOrt(tensor.type);
  if (datatype === undefined) throw new RpcError(status.INTERNAL, `output "${name}" has type ${tensor.type}, which has no KServe datatype`, { reason: 'INTERNAL' });
  const shape = tensor.dims.map((d) => BigInt(d));
  if (datatype === DataType.BYTES) {
    const strings = tensor.data as string[];
    return create(TensorSchema, { name, datatype, shape, data: encodeBytesElements(strings.map((s) => Buffer.from(s, 'utf8'))) });
  }
  const values = tensor.data as ArrayBufferView;
  return create(TensorSchema, { name, datatype, shape, data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) });
}

function typedView(array: TypedArrayConstructor, bytes: Uint8Array): ArrayBufferView {
  const count = bytes.byteLength / array.BYTES_PER_ELEMENT;
  if (bytes.byteOffset % array.BYTES_PER_ELEMENT === 0) return new array(bytes.buffer as ArrayBuffer, bytes.byteOffset, count);
  const copy = new Uint8Array(bytes.byteLength);
  copy.set(bytes);
  return new array(copy.buffer, 0, count);
}

function invalid(message: string): RpcError {
  return RpcError.invalidArgument(message, 'INVALID_TENSOR');
}
