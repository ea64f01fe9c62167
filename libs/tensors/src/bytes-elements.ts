import { isUtf8 } from 'node:buffer';

/**
 * BYTES tensors travel as their elements one after another, each a 4-byte little-endian length and
 * then its bytes (the KServe raw layout).
 */
export function encodeBytesElements(elements: readonly Uint8Array[]): Buffer {
  let total = 0;
  for (const e of elements) total += 4 + e.byteLength;
  const out = Buffer.allocUnsafe(total);
  let offset = 0;
  for (const e of elements) {
    out.writeUInt32LE(e.byteLength, offset);
    out.set(e, offset + 4);
    offset += 4 + e.byteLength;
  }
  return out;
}

/** Splits raw BYTES data into its elements; undefined when the layout is broken. */
export function decodeBytesElements(data: Uint8Array): Buffer[] | undefined {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const out: Buffer[] = [];
  let offset = 0;
  while (offset < buf.length) {
    if (offset + 4 > buf.length) return undefined;
    const length = buf.readUInt32LE(offset);
    offset += 4;
    if (offset + length > buf.length) return undefined;
    out.push(buf.subarray(offset, offset + length));
    offset += length;
  }
  return out;
}

/**
 * The first BYTES element onnxruntime-node cannot hold unchanged, and what is wrong with it, or
 * undefined when every element is fine. Its string tensors are NUL-terminated UTF-8 text: an element
 * with a NUL byte would be cut short there, and one that is not UTF-8 would have its bytes replaced.
 */
export function unservableBytesElement(
  elements: readonly Uint8Array[],
): { index: number; problem: string } | undefined {
  for (let index = 0; index < elements.length; index++) {
    const element = elements[index]!;
    if (element.includes(0)) return { index, problem: 'contains a NUL byte' };
    if (!isUtf8(element)) return { index, problem: 'is not valid UTF-8' };
  }
  return undefined;
}
