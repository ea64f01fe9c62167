import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

export { DataType };

/** What is known about each tensor datatype, in one table. */
export interface DataTypeInfo {
  readonly type: DataType;
  /** The KServe v2 name, e.g. "FP32". */
  readonly name: string;
  /** Bytes per element; 0 for BYTES, whose elements are length-prefixed. */
  readonly byteSize: number;
  /** onnxruntime-node's tensor type. */
  readonly ort: string;
  /** ONNX TensorProto.DataType. */
  readonly onnx: number;
}

const TABLE: readonly DataTypeInfo[] = [
  { type: DataType.BOOL, name: 'BOOL', byteSize: 1, ort: 'bool', onnx: 9 },
  { type: DataType.UINT8, name: 'UINT8', byteSize: 1, ort: 'uint8', onnx: 2 },
  { type: DataType.UINT16, name: 'UINT16', byteSize: 2, ort: 'uint16', onnx: 4 },
  { type: DataType.UINT32, name: 'UINT32', byteSize: 4, ort: 'uint32', onnx: 12 },
  { type: DataType.UINT64, name: 'UINT64', byteSize: 8, ort: 'uint64', onnx: 13 },
  { type: DataType.INT8, name: 'INT8', byteSize: 1, ort: 'int8', onnx: 3 },
  { type: DataType.INT16, name: 'INT16', byteSize: 2, ort: 'int16', onnx: 5 },
  { type: DataType.INT32, name: 'INT32', byteSize: 4, ort: 'int32', onnx: 6 },
  { type: DataType.INT64, name: 'INT64', byteSize: 8, ort: 'int64', onnx: 7 },
  { type: DataType.FP16, name: 'FP16', byteSize: 2, ort: 'float16', onnx: 10 },
  { type: DataType.FP32, name: 'FP32', byteSize: 4, ort: 'float32', onnx: 1 },
  { type: DataType.FP64, name: 'FP64', byteSize: 8, ort: 'float64', onnx: 11 },
  { type: DataType.BYTES, name: 'BYTES', byteSize: 0, ort: 'string', onnx: 8 },
  { type: DataType.BF16, name: 'BF16', byteSize: 2, ort: 'bfloat16', onnx: 16 },
];

const byType = new Map(TABLE.map((info) => [info.type, info]));
const byName = new Map(TABLE.map((info) => [info.name, info]));
const byOnnx = new Map(TABLE.map((info) => [info.onnx, info]));
const byOrt = new Map(TABLE.map((info) => [info.ort, info]));

export const ALL_DATATYPES: readonly DataTypeInfo[] = TABLE;

export function datatypeInfo(type: DataType): DataTypeInfo {
  const info = byType.get(type);
  if (info === undefined) throw new RangeError(`unknown datatype ${type}`);
  return info;
}

/** The KServe name ("FP32") of a datatype. */
export function datatypeName(type: DataType): string {
  return byType.get(type)?.name ?? 'UNSPECIFIED';
}

/** A datatype from its KServe name, or undefined for an unknown name. */
export function datatypeFromName(name: string): DataType | undefined {
  return byName.get(name)?.type;
}

export function datatypeFromOnnx(onnxType: number): DataType | undefined {
  return byOnnx.get(onnxType)?.type;
}

export function datatypeFromOrt(ortType: string): DataType | undefined {
  return byOrt.get(ortType)?.type;
}

export const DATATYPE_NAMES: readonly string[] = TABLE.map((info) => info.name);

/**
 * Datatypes infermesh knows but cannot serve: onnxruntime-node has no bfloat16 tensors, so a BF16
 * tensor can be neither fed to a session nor read from one. Requests with one are refused up front
 * (UNIMPLEMENTED), before any check against a model's signature.
 */
export const UNSERVED_DATATYPES: ReadonlySet<DataType> = new Set([DataType.BF16]);
