/** Initializers smaller than this stay inside the model: copying them costs less than mapping them. */
export const EXTERNAL_WEIGHT_MIN_BYTES = 64 * 1024;

// Field numbers of onnx.proto3 that the rewrite reads or writes.
const MODEL_GRAPH = 7;
const GRAPH_INITIALIZER = 5;
const TENSOR_RAW_DATA = 9;
const TENSOR_EXTERNAL_DATA = 13;
const TENSOR_DATA_LOCATION = 14;
const DATA_LOCATION_EXTERNAL = 1;

const LEN = 2;

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
    return undefined; // not a protobuf this reads: the runtime gets the bytes as they are
  }
}

/** A TensorProto's bytes with its raw data replaced by a reference to it in `fileName`; undefined to keep it. */
function externalTensor(model: Uint8Array, start: number, end: number, fileName: string): Uint8Array | undefined {
  let raw: [number, number] | undefined;
  for (const f of fields(model, start, end)) {
    if (f.field === TENSOR_EXTERNAL_DATA || f.field === TENSOR_DATA_LOCATION) return undefined;
    if (f.field === TENSOR_RAW_DATA && f.wire === LEN) raw = [f.valueStart, f.end];
  }
  if (raw === undefined || raw[1] - raw[0] < EXTERNAL_WEIGHT_MIN_BYTES) return undefined;
  const parts: Uint8Array[] = [];
  for (const f of fields(model, start, end))
    if (f.field !== TENSOR_RAW_DATA) parts.push(model.subarray(f.start, f.end));
  const entry = (key: string, value: string) =>
    lengthDelimited(TENSOR_EXTERNAL_DATA, concat([lengthDelimited(1, utf8(key)), lengthDelimited(2, utf8(value))]));
  parts.push(entry('location', fileName), entry('offset', String(raw[0])), entry('length', String(raw[1] - raw[0])));
  parts.push(varint((TENSOR_DATA_LOCATION << 3) | 0), varint(DATA_LOCATION_EXTERNAL));
  return concat(parts);
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
  const parts: Uint8Array[] = [];
  for (const f of fields(model, start, end)) {
    const content = f.wire === LEN ? replace(f.field, f.valueStart, f.end) : undefined;
    parts.push(content === undefined ? model.subarray(f.start, f.end) : lengthDelimited(f.field, content));
  }
  return concat(parts);
}

interface Field {
  field: number;
  wire: number;
  /** Where the field (its tag) starts. */
  start: number;
  /** Where a length-delimited field's content starts. */
  valueStart: number;
  end: number;
}

function* fields(bytes: Uint8Array, start: number, end: number): Generator<Field> {
  let pos = start;
  while (pos < end) {
    const fieldStart = pos;
    const [tag, afterTag] = readVarint(bytes, pos);
    const wire = tag % 8;
    const field = Math.floor(tag / 8);
    let valueStart = afterTag;
    let next: number;
    if (wire === 0) next = readVarint(bytes, afterTag)[1];
    else if (wire === 1) next = afterTag + 8;
    else if (wire === 5) next = afterTag + 4;
    else if (wire === LEN) {
      const [length, afterLength] = readVarint(bytes, afterTag);
      valueStart = afterLength;
      next = afterLength + length;
    } else throw new Error(`wire type ${wire}`);
    if (field === 0 || next > end) throw new Error('truncated');
    yield { field, wire, start: fieldStart, valueStart, end: next };
    pos = next;
  }
}

function readVarint(bytes: Uint8Array, pos: number): [number, number] {
  let value = 0;
  for (let shift = 1; pos < bytes.byteLength && shift < 2 ** 63; shift *= 128) {
    const byte = bytes[pos++]!;
    value += (byte & 0x7f) * shift;
    if (byte < 0x80) {
      if (!Number.isSafeInteger(value)) throw new Error('varint');
      return [value, pos];
    }
  }
  throw new Error('varint');
}

function varint(value: number): Uint8Array {
  const out: number[] = [];
  while (value >= 0x80) {
    out.push((value % 128) | 0x80);
    value = Math.floor(value / 128);
  }
  out.push(value);
  return Uint8Array.from(out);
}

function lengthDelimited(field: number, content: Uint8Array): Uint8Array {
  return concat([varint(field * 8 + LEN), varint(content.byteLength), content]);
}

function utf8(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

function concat(parts: Uint8Array[]): Uint8Array {
  return Buffer.concat(parts);
}
