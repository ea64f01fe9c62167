import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeFromOrt, datatypeName } from '@infermesh/tensors';

/** onnxruntime-node's type name and element size for each datatype it can hold (BYTES: 'string'). */
const ORT_TYPES: Partial<Record<DataType, { ort: string; byteSize: number }>> = {
  [DataType.BOOL]: { ort: 'bool', byteSize: 1 },
  [DataType.UINT8]: { ort: 'uint8', byteSize: 1 },
  [DataType.INT8]: { ort: 'int8', byteSize: 1 },
  [DataType.UINT16]: { ort: 'uint16', byteSize: 2 },
  [DataType.INT16]: { ort: 'int16', byteSize: 2 },
  [DataType.UINT32]: { ort: 'uint32', byteSize: 4 },
  [DataType.INT32]: { ort: 'int32', byteSize: 4 },
  [DataType.UINT64]: { ort: 'uint64', byteSize: 8 },
  [DataType.INT64]: { ort: 'int64', byteSize: 8 },
  [DataType.FP16]: { ort: 'float16', byteSize: 2 },
  [DataType.FP32]: { ort: 'float32', byteSize: 4 },
  [DataType.FP64]: { ort: 'float64', byteSize: 8 },
  [DataType.BYTES]: { ort: 'string', byteSize: 0 },
};

/**
 * A tensor as it crosses into an execution thread and back (see execution-thread.js): the
 * onnxruntime type name, the dimensions, and the data as one ArrayBuffer holding exactly the
 * tensor's bytes: little-endian elements, or for strings the KServe BYTES layout.
 */
export interface WireTensor {
  name: string;
  type: string;
  dims: number[];
  data: ArrayBuffer;
}

/**
 * An internal tensor as a wire tensor. The bytes are copied once into an ArrayBuffer of their own (a
 * memcpy: the caller's buffer stays intact, the copy is aligned and can be transferred). Throws
 * INVALID_ARGUMENT (INVALID_TENSOR) for fixed-size data that does not fit the shape, and
 * UNIMPLEMENTED (DATATYPE_UNSUPPORTED) for datatypes onnxruntime-node cannot hold (BF16).
 */
export function toWireTensor(tensor: Tensor): WireTensor {
  const dims = tensor.shape.map(Number);
  const kind = ORT_TYPES[tensor.datatype];
  if (kind === undefined) {
    throw Errors.datatypeUnsupported(
      `tensor "${tensor.name}": datatype ${datatypeName(tensor.datatype)} is not supported by ONNX Runtime, which serves this model`,
      { metadata: { tensor: tensor.name, datatype: datatypeName(tensor.datatype) } },
    );
  }
  if (kind.byteSize > 0) {
    const needed = dims.reduce((a, b) => a * b, 1) * kind.byteSize;
    if (tensor.data.byteLength !== needed) {
      throw Errors.invalidTensor(
        `tensor "${tensor.name}" has ${tensor.data.byteLength} bytes of data but its shape needs ${needed}`,
      );
    }
  }
  return { name: tensor.name, type: kind.ort, dims, data: new Uint8Array(tensor.data).buffer };
}

/** A wire tensor from an execution thread as an internal tensor; the buffer becomes its data without a copy. */
export function fromWireTensor(wire: WireTensor): Tensor {
  const datatype = datatypeFromOrt(wire.type);
  if (datatype === undefined) {
    throw Errors.internal(`output "${wire.name}" has type ${wire.type}, which has no KServe datatype`);
  }
  return create(TensorSchema, {
    name: wire.name,
    datatype,
    shape: wire.dims.map((d) => BigInt(d)),
    data: new Uint8Array(wire.data),
  });
}

/** The buffers of wire tensors, to transfer rather than copy. */
export function transferables(tensors: readonly WireTensor[]): ArrayBuffer[] {
  return tensors.map((t) => t.data);
}
