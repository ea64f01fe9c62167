import { quoted } from './bounded-text';
import { DataType, datatypeInfo } from './datatypes';
import { decodeBytesElements, encodeBytesElements } from './bytes-elements';
import { shortestBfloat16, shortestFloat32, shortestHalf, toBfloat16Bits, toHalfBits } from './half-float';

/** Bad tensor contents; the message names the tensor and what is wrong with it. */
export class TensorDataError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TensorDataError';
  }
}

const INT_RANGES: Partial<Record<DataType, [number, number]>> = {
  [DataType.UINT8]: [0, 0xff],
  [DataType.UINT16]: [0, 0xffff],
  [DataType.UINT32]: [0, 0xffffffff],
  [DataType.INT8]: [-0x80, 0x7f],
  [DataType.INT16]: [-0x8000, 0x7fff],
  [DataType.INT32]: [-0x80000000, 0x7fffffff],
};

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Flattens the nested (row-major) arrays of a JSON tensor's `data`. */
export function flattenJsonData(data: unknown): unknown[] {
  if (!Array.isArray(data)) return [data];
  if (!data.some(Array.isArray)) return data;
  const out: unknown[] = [];
  const stack: unknown[][] = [data];
  const index: number[] = [0];
  while (stack.length > 0) {
    const top = stack[stack.length - 1]!;
    const i = index[index.length - 1]!;
    if (i >= top.length) {
      stack.pop();
      index.pop();
      continue;
    }
    index[index.length - 1] = i + 1;
    const item = top[i];
    if (Array.isArray(item)) {
      stack.push(item);
      index.push(0);
    } else out.push(item);
  }
  return out;
}

function bigIntOf(value: unknown, min: bigint, max: bigint): bigint | undefined {
  let result: bigint;
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) return undefined;
    result = BigInt(value);
  } else if (typeof value === 'string' && /^-?\d{1,20}$/.test(value)) {
    result = BigInt(value);
  } else return undefined;
  return result >= min && result <= max ? result : undefined;
}

/**
 * Converts a JSON tensor's data (flat or nested) to raw little-endian bytes, checking each element
 * against the datatype: integers in range, finite numbers, booleans for BOOL, strings for BYTES.
 */
export function jsonToRaw(tensor: string, type: DataType, data: unknown, expectedCount: number): Buffer {
  const values = flattenJsonData(data);
  if (values.length !== expectedCount) {
    throw new TensorDataError(
      `input ${quoted(tensor)}: data has ${values.length} elements but its shape needs ${expectedCount}`,
    );
  }
  const shown = (v: unknown) => (typeof v === 'number' ? String(v) : (JSON.stringify(v) ?? String(v))); // NaN and ±Infinity are not "null"
  const bad = (i: number, what: string) =>
    new TensorDataError(`input ${quoted(tensor)}: element ${i} (${shown(values[i])}) is not ${what}`);
  const info = datatypeInfo(type);
  if (type === DataType.BYTES) {
    return encodeBytesElements(
      values.map((v, i) => {
        if (typeof v !== 'string') throw bad(i, 'a string');
        // UTF-8 has no encoding for a lone surrogate: Buffer.from would put U+FFFD in its place.
        if (LONE_SURROGATE.test(v)) throw bad(i, 'well-formed Unicode (it has a lone surrogate)');
        return Buffer.from(v, 'utf8');
      }),
    );
  }
  const out = Buffer.alloc(values.length * info.byteSize);
  const range = INT_RANGES[type];
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    switch (type) {
      case DataType.BOOL:
        if (typeof v !== 'boolean') throw bad(i, 'a boolean');
        out[i] = v ? 1 : 0;
        break;
      case DataType.UINT8:
      case DataType.UINT16:
      case DataType.UINT32:
      case DataType.INT8:
      case DataType.INT16:
      case DataType.INT32: {
        if (typeof v !== 'number' || !Number.isInteger(v) || v < range![0] || v > range![1]) {
          throw bad(i, `an integer in the ${info.name} range [${range![0]}, ${range![1]}]`);
        }
        if (range![0] < 0) out.writeIntLE(v, i * info.byteSize, info.byteSize);
        else out.writeUIntLE(v, i * info.byteSize, info.byteSize);
        break;
      }
      case DataType.INT64: {
        const b = bigIntOf(v, -(2n ** 63n), 2n ** 63n - 1n);
        if (b === undefined) throw bad(i, 'an integer in the INT64 range');
        out.writeBigInt64LE(b, i * 8);
        break;
      }
      case DataType.UINT64: {
        const b = bigIntOf(v, 0n, 2n ** 64n - 1n);
        if (b === undefined) throw bad(i, 'an integer in the UINT64 range');
        out.writeBigUInt64LE(b, i * 8);
        break;
      }
      case DataType.FP16:
      case DataType.BF16:
      case DataType.FP32:
      case DataType.FP64: {
        if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(i, 'a finite number');
        // FP32 and BF16 take any value that rounds to a finite one: 3.4028235e38, FP32's largest as
        // float32 printers write it, is accepted, and nothing becomes Infinity unasked.
        if (type === DataType.FP32) {
          if (!Number.isFinite(Math.fround(v))) throw bad(i, 'within the FP32 range');
          out.writeFloatLE(v, i * 4);
        } else if (type === DataType.FP64) out.writeDoubleLE(v, i * 8);
        else if (type === DataType.FP16) {
          if (Math.abs(v) > 65504) throw bad(i, 'within the FP16 range');
          out.writeUInt16LE(toHalfBits(v), i * 2);
        } else {
          const bits = toBfloat16Bits(v);
          if ((bits & 0x7fff) === 0x7f80) throw bad(i, 'within the BF16 range');
          out.writeUInt16LE(bits, i * 2);
        }
        break;
      }
      default:
        throw new TensorDataError(`input ${quoted(tensor)}: datatype ${info.name} is not supported in JSON`);
    }
  }
  return out;
}

/**
 * Converts raw bytes to a flat JSON array. Floating-point values are written with the fewest digits
 * that read back to the same bits; 64-bit integers become numbers when they are safe integers and
 * decimal strings otherwise, so no value is silently rounded.
 */
export function rawToJson(type: DataType, data: Uint8Array): unknown[] {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const info = datatypeInfo(type);
  if (type === DataType.BYTES) {
    const elements = decodeBytesElements(buf);
    if (elements === undefined) throw new TensorDataError('BYTES data has a broken length prefix');
    return elements.map((e) => e.toString('utf8'));
  }
  const n = info.byteSize === 0 ? 0 : Math.floor(buf.length / info.byteSize);
  const out: unknown[] = new Array(n);
  for (let i = 0; i < n; i++) {
    switch (type) {
      case DataType.BOOL:
        out[i] = buf[i] !== 0;
        break;
      case DataType.UINT8:
        out[i] = buf.readUInt8(i);
        break;
      case DataType.UINT16:
        out[i] = buf.readUInt16LE(i * 2);
        break;
      case DataType.UINT32:
        out[i] = buf.readUInt32LE(i * 4);
        break;
      case DataType.INT8:
        out[i] = buf.readInt8(i);
        break;
      case DataType.INT16:
        out[i] = buf.readInt16LE(i * 2);
        break;
      case DataType.INT32:
        out[i] = buf.readInt32LE(i * 4);
        break;
      case DataType.INT64: {
        const b = buf.readBigInt64LE(i * 8);
        out[i] =
          b >= BigInt(Number.MIN_SAFE_INTEGER) && b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b.toString();
        break;
      }
      case DataType.UINT64: {
        const b = buf.readBigUInt64LE(i * 8);
        out[i] = b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b.toString();
        break;
      }
      case DataType.FP16:
        out[i] = shortestHalf(buf.readUInt16LE(i * 2));
        break;
      case DataType.BF16:
        out[i] = shortestBfloat16(buf.readUInt16LE(i * 2));
        break;
      case DataType.FP32:
        out[i] = shortestFloat32(buf.readFloatLE(i * 4));
        break;
      case DataType.FP64:
        out[i] = buf.readDoubleLE(i * 8);
        break;
      default:
        throw new TensorDataError(`datatype ${info.name} cannot be written as JSON`);
    }
  }
  return out;
}
