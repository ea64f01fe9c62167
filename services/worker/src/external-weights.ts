import { BinaryReader, BinaryWriter, WireType } from '@bufbuild/protobuf/wire';

/** Initializers smaller than this stay inside the model: copying them costs less than mapping them. */
export const EXTERNAL_WEIGHT_MIN_BYTES = 64 * 1024;

// Field numbers of onnx.proto3 that the rewrite reads or writes.
const MODEL_GRAPH = 7;
const GRAPH_INITIALIZER = 5;
const TENSOR_RAW_DATA = 9;
const TENSOR_EXTERNAL_DATA = 13;
const TENSOR_DATA_LOCATION = 14;
const DATA_LOCATION_EXTERNAL = 1;

/**
 * The model with its graph's large initializers (raw data of EXTERNAL_WEIGHT_MIN_BYTES or more) turned
 * into references to the same bytes in `fileName`, a file in the directory the session is told of
 * (`model_external_initializers_file_folder_path`) that holds exactly `model`; undefined when the
 * model has no such initializer, or when it cannot be read this way (the caller then loads `model`
 * itself, and the runtime names what is wrong with it).
 *
 * Why: loaded from its bytes, onnxruntime copies each weight twice (the parsed protobuf, then the
 * tensor) before it prepacks it, and frees the copies in an order the C library cannot reuse for
 * blocks under its mmap threshold (4 MiB, WORKER_MALLOC_ENV): the heap keeps the holes. Read as
 * external data, each weight is mapped from the file, packed, and the mapping let go.
 *
 * The rewrite is byte-level: every other field (those of later ONNX versions too) is copied as it is;
 * only the ModelProto → graph → initializer → raw_data fields are replaced (by external_data and
 * data_location) and the enclosing lengths written again. Subgraphs keep their initializers.
 */
export function externalWeights(model: Uint8Array, fileName: string): Uint8Array | undefined {
  try {
    let moved = 0;
    const out = rewrite(model, 0, model.byteLength, (field, start, end) => {
      if (field !== MODEL_GRAPH) return undefined;
      return rewrite(model, start, end, (gField, gStart, gEnd) => {
        if (gField !== GRAPH_INITIALIZER) return undefined;
        const tensor = externalTensor(model, gStart, gEnd, fileName);
        if (tensor !== undefined) moved += 1;
        return tensor;
      });
    });
    return moved === 0 ? undefined : out;
  } catch {
    return undefined; // not a protobuf: the runtime gets the bytes as they are, and names what is wrong
  }
}

/** A TensorProto's bytes with its raw data replaced by a reference to it in `fileName`; undefined to keep it. */
function externalTensor(model: Uint8Array, start: number, end: number, fileName: string): Uint8Array | undefined {
  let raw: Field | undefined;
  for (const f of fields(model, start, end)) {
    if (f.field === TENSOR_EXTERNAL_DATA || f.field === TENSOR_DATA_LOCATION) return undefined;
    if (f.field === TENSOR_RAW_DATA && f.wire === WireType.LengthDelimited) raw = f;
  }
  if (raw === undefined || raw.end - raw.valueStart < EXTERNAL_WEIGHT_MIN_BYTES) return undefined;
  const writer = new BinaryWriter();
  for (const f of fields(model, start, end))
    if (f.field !== TENSOR_RAW_DATA) writer.raw(model.subarray(f.start, f.end));
  const entries = { location: fileName, offset: String(raw.valueStart), length: String(raw.end - raw.valueStart) };
  for (const [key, value] of Object.entries(entries)) {
    writer.tag(TENSOR_EXTERNAL_DATA, WireType.LengthDelimited).fork();
    writer.tag(1, WireType.LengthDelimited).string(key).tag(2, WireType.LengthDelimited).string(value).join();
  }
  writer.tag(TENSOR_DATA_LOCATION, WireType.Varint).int32(DATA_LOCATION_EXTERNAL);
  return writer.finish();
}

/**
 * The message in model[start, end) with each length-delimited field that `replace` answers for
 * replaced by the field with that content; every other field copied as it is.
 */
function rewrite(
  model: Uint8Array,
  start: number,
  end: number,
  replace: (field: number, start: number, end: number) => Uint8Array | undefined,
): Uint8Array {
  const writer = new BinaryWriter();
  for (const f of fields(model, start, end)) {
    const content = f.wire === WireType.LengthDelimited ? replace(f.field, f.valueStart, f.end) : undefined;
    if (content === undefined) writer.raw(model.subarray(f.start, f.end));
    else writer.tag(f.field, WireType.LengthDelimited).bytes(content);
  }
  return writer.finish();
}

interface Field {
  field: number;
  wire: WireType;
  /** Where the field (its tag) starts. */
  start: number;
  /** Where a length-delimited field's content starts. */
  valueStart: number;
  end: number;
}

/** The fields of the message in bytes[start, end), in order; throws on bytes that are not one. */
function* fields(bytes: Uint8Array, start: number, end: number): Generator<Field> {
  const reader = new BinaryReader(bytes.subarray(start, end));
  while (reader.pos < reader.len) {
    const fieldStart = reader.pos;
    const [field, wire] = reader.tag();
    let valueStart = reader.pos;
    if (wire === WireType.LengthDelimited) {
      const length = reader.uint32();
      valueStart = reader.pos;
      reader.pos += length;
      if (reader.pos > reader.len) throw new RangeError('premature EOF');
    } else reader.skip(wire, field);
    yield { field, wire, start: start + fieldStart, valueStart: start + valueStart, end: start + reader.pos };
  }
}
