import { create, toBinary, ScalarType, type DescField, type DescMessage } from '@bufbuild/protobuf';
import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import { FeatureSet_FieldPresence, isWrapperDesc } from '@bufbuild/protobuf/wkt';

/**
 * Binary protobuf encoding that sizes a message first and then writes it once into a buffer of
 * exactly that size. The bytes are those of @bufbuild/protobuf's `toBinary`, which grows its buffer
 * by doubling, shifts every nested message longer than 127 bytes to widen its length prefix and
 * slices the result: for a message carrying a tensor, five copies of the tensor's bytes where this
 * makes one.
 *
 * The common proto3 shapes are encoded here: strings, bytes, bools, 32-bit integers and enums,
 * nested messages, repeated fields, maps with string keys, oneofs, optional fields and unknown
 * fields. Other scalars and packed lists are encoded by protobuf-es's `BinaryWriter` during the
 * sizing pass and copied in. A message type with a field protobuf-es represents differently from
 * its wire form (wrapper and Struct fields, delimited encoding, required fields, maps with other
 * keys) is encoded whole by `toBinary`.
 */
export function encodeMessage(schema: DescMessage, message: object, options: EncodeOptions = {}): Buffer {
  const codec = messageCodec(schema);
  const encoding = new Encoding();
  const size = codec.size(message as Fields, encoding);
  encoding.buf = options.ownBuffer ? Buffer.allocUnsafeSlow(size) : Buffer.allocUnsafe(size);
  codec.write(message as Fields, encoding);
  if (encoding.pos !== size) {
    throw new Error(`${schema.typeName} encoded to ${encoding.pos} bytes where it was sized at ${size}`);
  }
  return encoding.buf;
}

export interface EncodeOptions {
  /**
   * The bytes get a buffer of their own, never a slice of Node's shared pool: for bytes that are
   * kept (a small slice would keep its whole pool slab alive). Bytes handed to a transport, which
   * copies them, take the pool.
   */
  ownBuffer?: boolean;
}

type Fields = Record<string, unknown>;

/**
 * One encoding in progress. The sizing pass leaves behind the length of every nested message and
 * string and the bytes of every value it had protobuf-es encode, in the order the writing pass
 * visits them again.
 */
class Encoding {
  readonly sizes: number[] = [];
  readonly chunks: Uint8Array[] = [];
  private sizeCursor = 0;
  private chunkCursor = 0;
  buf = EMPTY;
  pos = 0;

  varint(value: number): void {
    const buf = this.buf;
    while (value > 0x7f) {
      buf[this.pos++] = (value & 0x7f) | 0x80;
      value >>>= 7;
    }
    buf[this.pos++] = value;
  }

  raw(bytes: Uint8Array): void {
    this.buf.set(bytes, this.pos);
    this.pos += bytes.byteLength;
  }

  /** Writes the next chunk the sizing pass encoded. */
  chunk(): void {
    this.raw(this.chunks[this.chunkCursor++]!);
  }

  /** The next length the sizing pass recorded. */
  nextSize(): number {
    return this.sizes[this.sizeCursor++]!;
  }

  string(value: string, length: number): void {
    const buf = this.buf;
    if (length === value.length && length < 64) {
      for (let i = 0; i < length; i++) buf[this.pos + i] = value.charCodeAt(i);
    } else {
      buf.write(value, this.pos, length, 'utf8');
    }
    this.pos += length;
  }
}

const EMPTY = Buffer.alloc(0);

/** Sizes and writes one message, one field or one value; `size` also records what `write` reads back. */
interface Codec<T> {
  size(value: T, encoding: Encoding): number;
  write(value: T, encoding: Encoding): void;
}

function varintSize(value: number): number {
  return value < 0x80 ? 1 : value < 0x4000 ? 2 : value < 0x200000 ? 3 : value < 0x10000000 ? 4 : 5;
}

function tagOf(fieldNo: number, wireType: WireType): number {
  return ((fieldNo << 3) | wireType) >>> 0;
}

const messageCodecs = new WeakMap<DescMessage, Codec<Fields>>();

function messageCodec(desc: DescMessage): Codec<Fields> {
  let codec = messageCodecs.get(desc);
  if (codec === undefined) {
    codec = desc.fields.some(needsProtobufEs) ? protobufEsCodec(desc) : compileMessage(desc);
  }
  return codec;
}

/** A field whose value protobuf-es holds in another form than its wire form, or writes in a way not done here. */
function needsProtobufEs(field: DescField): boolean {
  if (field.presence === FeatureSet_FieldPresence.LEGACY_REQUIRED) return true;
  switch (field.fieldKind) {
    case 'message':
      return (
        field.delimitedEncoding || usesStruct(field) || (field.oneof === undefined && isWrapperDesc(field.message))
      );
    case 'list':
      return field.listKind === 'message' && (field.delimitedEncoding || usesStruct(field));
    case 'map':
      return field.mapKey !== ScalarType.STRING || (field.mapKind === 'message' && usesStruct(field));
    default:
      return false;
  }
}

/** google.protobuf.Struct fields are held as plain JSON objects, except inside google.protobuf.Value. */
function usesStruct(field: { message: DescMessage; parent: DescMessage }): boolean {
  return field.message.typeName === 'google.protobuf.Struct' && field.parent.typeName !== 'google.protobuf.Value';
}

function protobufEsCodec(desc: DescMessage): Codec<Fields> {
  const codec: Codec<Fields> = {
    size(message, encoding) {
      const bytes = toBinary(desc, message as never);
      encoding.chunks.push(bytes);
      return bytes.byteLength;
    },
    write(_message, encoding) {
      encoding.chunk();
    },
  };
  messageCodecs.set(desc, codec);
  return codec;
}

function compileMessage(desc: DescMessage): Codec<Fields> {
  const typeName = desc.typeName;
  const fields: Codec<Fields>[] = [];
  const codec: Codec<Fields> = {
    size(message, encoding) {
      if (message.$typeName !== typeName) {
        throw new Error(`cannot encode a ${String(message.$typeName)} message as ${typeName}`);
      }
      let size = 0;
      for (const field of fields) size += field.size(message, encoding);
      const unknown = message.$unknown as UnknownField[] | undefined;
      if (unknown !== undefined) {
        for (const { no, wireType, data } of unknown) size += varintSize(tagOf(no, wireType)) + data.byteLength;
      }
      return size;
    },
    write(message, encoding) {
      for (const field of fields) field.write(message, encoding);
      const unknown = message.$unknown as UnknownField[] | undefined;
      if (unknown !== undefined) {
        for (const { no, wireType, data } of unknown) {
          encoding.varint(tagOf(no, wireType));
          encoding.raw(data);
        }
      }
    },
  };
  // Registered before its fields compile, so that a recursive type finds itself.
  messageCodecs.set(desc, codec);
  for (const field of [...desc.fields].sort((a, b) => a.number - b.number)) fields.push(compileField(field));
  return codec;
}

interface UnknownField {
  no: number;
  wireType: WireType;
  data: Uint8Array;
}

function compileField(field: DescField): Codec<Fields> {
  switch (field.fieldKind) {
    case 'scalar':
    case 'enum':
    case 'message':
      return present(field, singularValue(field, field.number));
    case 'list':
      return listField(field);
    case 'map':
      return mapField(field);
  }
}

/** Reads a singular field's value from its message, undefined where the field is not set. */
function reader(field: DescField): (message: Fields) => unknown {
  const name = field.localName;
  if (field.oneof !== undefined) {
    const oneof = field.oneof.localName;
    return (message) => {
      const selected = message[oneof] as { case?: string; value?: unknown };
      return selected.case === name ? selected.value : undefined;
    };
  }
  if (field.presence !== FeatureSet_FieldPresence.IMPLICIT) {
    return (message) => (Object.prototype.hasOwnProperty.call(message, name) ? message[name] : undefined);
  }
  // Implicit presence: a field holding its zero value is not written.
  if (field.fieldKind === 'enum') {
    const zero = field.enum.values[0]!.number;
    return (message) => (message[name] !== zero ? message[name] : undefined);
  }
  switch (field.fieldKind === 'scalar' ? field.scalar : undefined) {
    case ScalarType.BOOL:
      return (message) => (message[name] !== false ? message[name] : undefined);
    case ScalarType.STRING:
      return (message) => (message[name] !== '' ? message[name] : undefined);
    case ScalarType.BYTES:
      return (message) => {
        const value = message[name];
        return !(value instanceof Uint8Array) || value.byteLength > 0 ? value : undefined;
      };
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return (message) => (!Object.is(message[name], 0) ? message[name] : undefined);
    default:
      // Loose comparison matches 0n, 0 and "0".
      return (message) => (message[name] != 0 ? message[name] : undefined);
  }
}

function present(field: DescField, value: Codec<unknown>): Codec<Fields> {
  const read = reader(field);
  return {
    size(message, encoding) {
      const v = read(message);
      return v === undefined ? 0 : value.size(v, encoding);
    },
    write(message, encoding) {
      const v = read(message);
      if (v !== undefined) value.write(v, encoding);
    },
  };
}

/** The codec of one value of a field, tag included, as field number `fieldNo` (2 for a map's value). */
function singularValue(field: DescField, fieldNo: number): Codec<unknown> {
  if (field.fieldKind === 'message' || (field.fieldKind === 'list' && field.listKind === 'message')) {
    return messageValue(field.message, fieldNo);
  }
  if (field.fieldKind === 'map' && field.mapKind === 'message') return messageValue(field.message, fieldNo);
  const scalar = scalarTypeOf(field);
  const context = `${field.parent.typeName}.${field.name}`;
  switch (scalar) {
    case ScalarType.STRING:
      return stringValue(fieldNo);
    case ScalarType.BYTES:
      return bytesValue(fieldNo, context);
    case ScalarType.BOOL: {
      const tag = tagOf(fieldNo, WireType.Varint);
      return {
        size: () => varintSize(tag) + 1,
        write(value, encoding) {
          encoding.varint(tag);
          encoding.buf[encoding.pos++] = value ? 1 : 0;
        },
      };
    }
    case ScalarType.INT32:
    case ScalarType.UINT32:
      return int32Value(fieldNo, scalar, context);
    default:
      return protobufEsValue(fieldNo, scalar, context);
  }
}

function scalarTypeOf(field: DescField): ScalarType {
  switch (field.fieldKind) {
    case 'scalar':
      return field.scalar;
    case 'list':
      return field.listKind === 'scalar' ? field.scalar : ScalarType.INT32;
    case 'map':
      return field.mapKind === 'scalar' ? field.scalar : ScalarType.INT32;
    default:
      // Enums are written as int32.
      return ScalarType.INT32;
  }
}

function messageValue(desc: DescMessage, fieldNo: number): Codec<unknown> {
  const tag = tagOf(fieldNo, WireType.LengthDelimited);
  const tagSize = varintSize(tag);
  let child: Codec<Fields> | undefined;
  const codec = () => (child ??= messageCodec(desc));
  return {
    size(value, encoding) {
      const slot = encoding.sizes.length;
      encoding.sizes.push(0);
      const size = codec().size((value ?? create(desc)) as Fields, encoding);
      encoding.sizes[slot] = size;
      return tagSize + varintSize(size) + size;
    },
    write(value, encoding) {
      encoding.varint(tag);
      encoding.varint(encoding.nextSize());
      codec().write((value ?? create(desc)) as Fields, encoding);
    },
  };
}

function stringValue(fieldNo: number): Codec<unknown> {
  const tag = tagOf(fieldNo, WireType.LengthDelimited);
  const tagSize = varintSize(tag);
  return {
    size(value, encoding) {
      const length = Buffer.byteLength(typeof value === 'string' ? value : String(value), 'utf8');
      encoding.sizes.push(length);
      return tagSize + varintSize(length) + length;
    },
    write(value, encoding) {
      const length = encoding.nextSize();
      encoding.varint(tag);
      encoding.varint(length);
      encoding.string(typeof value === 'string' ? value : String(value), length);
    },
  };
}

function bytesValue(fieldNo: number, context: string): Codec<unknown> {
  const tag = tagOf(fieldNo, WireType.LengthDelimited);
  const tagSize = varintSize(tag);
  return {
    size(value) {
      if (!(value instanceof Uint8Array)) {
        throw new Error(`cannot encode field ${context} to binary: invalid bytes: ${typeof value}`);
      }
      return tagSize + varintSize(value.byteLength) + value.byteLength;
    },
    write(value, encoding) {
      const bytes = value as Uint8Array;
      encoding.varint(tag);
      encoding.varint(bytes.byteLength);
      encoding.raw(bytes);
    },
  };
}

/** int32, uint32 and enums, checked as protobuf-es checks them. */
function int32Value(fieldNo: number, scalar: ScalarType.INT32 | ScalarType.UINT32, context: string): Codec<unknown> {
  const tag = tagOf(fieldNo, WireType.Varint);
  const tagSize = varintSize(tag);
  const [min, max, kind] = scalar === ScalarType.INT32 ? [-0x80000000, 0x7fffffff, 'int32'] : [0, 0xffffffff, 'uint32'];
  const check = (value: unknown): number => {
    const n = typeof value === 'string' ? Number(value) : value;
    if (typeof n !== 'number')
      throw new Error(`cannot encode field ${context} to binary: invalid ${kind}: ${typeof n}`);
    if (!Number.isInteger(n) || n > max || n < min) {
      throw new Error(`cannot encode field ${context} to binary: invalid ${kind}: ${n}`);
    }
    return n;
  };
  return {
    // A negative int32 is sign-extended to ten bytes.
    size: (value) => {
      const n = check(value);
      return tagSize + (n < 0 ? 10 : varintSize(n));
    },
    write(value, encoding) {
      let n = check(value);
      encoding.varint(tag);
      if (n >= 0) {
        encoding.varint(n);
        return;
      }
      const buf = encoding.buf;
      for (let i = 0; i < 9; i++) {
        buf[encoding.pos++] = (n & 0x7f) | 0x80;
        n >>= 7;
      }
      buf[encoding.pos++] = 1;
    },
  };
}

const scratch = new BinaryWriter();

/** Runs protobuf-es's writer for one value, with its errors named as protobuf-es names them. */
function withContext(context: string, write: () => void): Uint8Array {
  try {
    write();
    return scratch.finish();
  } catch (error) {
    scratch.finish();
    if (error instanceof Error) throw new Error(`cannot encode field ${context} to binary: ${error.message}`);
    throw error;
  }
}

function scalarWriter(scalar: ScalarType): (writer: BinaryWriter, value: never) => void {
  switch (scalar) {
    case ScalarType.STRING:
      return (writer, value) => writer.string(value);
    case ScalarType.BOOL:
      return (writer, value) => writer.bool(value);
    case ScalarType.DOUBLE:
      return (writer, value) => writer.double(value);
    case ScalarType.FLOAT:
      return (writer, value) => writer.float(value);
    case ScalarType.INT32:
      return (writer, value) => writer.int32(value);
    case ScalarType.INT64:
      return (writer, value) => writer.int64(value);
    case ScalarType.UINT64:
      return (writer, value) => writer.uint64(value);
    case ScalarType.FIXED64:
      return (writer, value) => writer.fixed64(value);
    case ScalarType.BYTES:
      return (writer, value) => writer.bytes(value);
    case ScalarType.FIXED32:
      return (writer, value) => writer.fixed32(value);
    case ScalarType.SFIXED32:
      return (writer, value) => writer.sfixed32(value);
    case ScalarType.SFIXED64:
      return (writer, value) => writer.sfixed64(value);
    case ScalarType.SINT64:
      return (writer, value) => writer.sint64(value);
    case ScalarType.UINT32:
      return (writer, value) => writer.uint32(value);
    case ScalarType.SINT32:
      return (writer, value) => writer.sint32(value);
  }
}

function wireTypeOf(scalar: ScalarType): WireType {
  switch (scalar) {
    case ScalarType.BYTES:
    case ScalarType.STRING:
      return WireType.LengthDelimited;
    case ScalarType.DOUBLE:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return WireType.Bit64;
    case ScalarType.FIXED32:
    case ScalarType.SFIXED32:
    case ScalarType.FLOAT:
      return WireType.Bit32;
    default:
      return WireType.Varint;
  }
}

/** A 64-bit, zigzag, fixed-width or floating-point value, encoded by protobuf-es in the sizing pass. */
function protobufEsValue(fieldNo: number, scalar: ScalarType, context: string): Codec<unknown> {
  const wireType = wireTypeOf(scalar);
  const writeScalar = scalarWriter(scalar);
  return {
    size(value, encoding) {
      const bytes = withContext(context, () => writeScalar(scratch.tag(fieldNo, wireType), value as never));
      encoding.chunks.push(bytes);
      return bytes.byteLength;
    },
    write(_value, encoding) {
      encoding.chunk();
    },
  };
}

function listField(field: Extract<DescField, { fieldKind: 'list' }>): Codec<Fields> {
  const name = field.localName;
  const fieldNo = field.number;
  const scalar = scalarTypeOf(field);
  if (field.listKind === 'message' || scalar === ScalarType.STRING || scalar === ScalarType.BYTES) {
    const item = singularValue(field, fieldNo);
    return {
      size(message, encoding) {
        const items = message[name] as unknown[];
        let size = 0;
        for (const value of items) size += item.size(value, encoding);
        return size;
      },
      write(message, encoding) {
        const items = message[name] as unknown[];
        for (const value of items) item.write(value, encoding);
      },
    };
  }
  // Numbers, bools and enums: protobuf-es writes the whole list, packed or not, in the sizing pass.
  const context = `${field.parent.typeName}.${field.name}`;
  const writeScalar = scalarWriter(scalar);
  const packed = field.packed;
  const wireType = wireTypeOf(scalar);
  return {
    size(message, encoding) {
      const items = message[name] as unknown[];
      if (items.length === 0) return 0;
      const bytes = withContext(context, () => {
        if (packed) {
          scratch.tag(fieldNo, WireType.LengthDelimited).fork();
          for (let i = 0; i < items.length; i++) writeScalar(scratch, items[i] as never);
          scratch.join();
        } else {
          for (let i = 0; i < items.length; i++) writeScalar(scratch.tag(fieldNo, wireType), items[i] as never);
        }
      });
      encoding.chunks.push(bytes);
      return bytes.byteLength;
    },
    write(message, encoding) {
      if ((message[name] as unknown[]).length > 0) encoding.chunk();
    },
  };
}

/** A map with string keys: each entry a message of its key (field 1) and its value (field 2). */
function mapField(field: Extract<DescField, { fieldKind: 'map' }>): Codec<Fields> {
  const name = field.localName;
  const tag = tagOf(field.number, WireType.LengthDelimited);
  const tagSize = varintSize(tag);
  const key = stringValue(1);
  const value = singularValue(field, 2);
  return {
    size(message, encoding) {
      const record = message[name] as Record<string, unknown>;
      let size = 0;
      for (const k of Object.keys(record)) {
        const slot = encoding.sizes.length;
        encoding.sizes.push(0);
        const entry = key.size(k, encoding) + value.size(record[k], encoding);
        encoding.sizes[slot] = entry;
        size += tagSize + varintSize(entry) + entry;
      }
      return size;
    },
    write(message, encoding) {
      const record = message[name] as Record<string, unknown>;
      for (const k of Object.keys(record)) {
        encoding.varint(tag);
        encoding.varint(encoding.nextSize());
        key.write(k, encoding);
        value.write(record[k], encoding);
      }
    },
  };
}
