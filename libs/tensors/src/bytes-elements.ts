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
