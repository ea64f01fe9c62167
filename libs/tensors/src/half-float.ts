const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** Node 24's own half-precision conversions (DataView#setFloat16 rounds once, to nearest even). */
const half = new DataView(new ArrayBuffer(2));

/** IEEE 754 half-precision bits of a number, rounding to nearest even. */
export function toHalfBits(value: number): number {
  half.setFloat16(0, value);
  return half.getUint16(0);
}

/** The number a half-precision bit pattern stands for. */
export function fromHalfBits(bits: number): number {
  half.setUint16(0, bits);
  return half.getFloat16(0);
}

/** bfloat16 bits of a number, rounding to nearest even. */
export function toBfloat16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x40) & 0xffff; // NaN stays NaN
  // Rounding to float32 first can land a value just off a tie on the tie itself; which way it moved
  // then decides, so the result is the one rounding the value once would give.
  const moved = Math.abs(value) - Math.abs(f32[0]);
  const rest = x & 0xffff;
  const up = rest > 0x8000 || (rest === 0x8000 && (moved > 0 || (moved === 0 && ((x >>> 16) & 1) !== 0)));
  return ((x >>> 16) + (up ? 1 : 0)) & 0xffff;
}

export function fromBfloat16Bits(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/**
 * The number with the fewest significant digits that converts back to the same bits, so JSON
 * shows what a person would write (0.1, not 0.10000000149011612) and stays bit-exact on the way
 * back. Non-finite values are returned as they are.
 */
function shortest(value: number, fromDigits: number, toDigits: number, same: (candidate: number) => boolean): number {
  // Integers print exactly below 1e21; past it JavaScript writes them with an exponent and 17 digits.
  if (!Number.isFinite(value) || (Number.isInteger(value) && Math.abs(value) < 1e21)) return value;
  for (let digits = fromDigits; digits <= toDigits; digits++) {
    const candidate = Number(value.toPrecision(digits));
    if (same(candidate)) return candidate;
  }
  return value;
}

/** A float32 value as its shortest round-tripping decimal (at most 9 significant digits). */
export function shortestFloat32(value: number): number {
  // Any value with fewer than 6 digits survives toPrecision(6) unchanged, so the search starts there.
  return shortest(value, 6, 9, (candidate) => Math.fround(candidate) === value);
}

/** An FP16 bit pattern as its shortest round-tripping decimal (at most 5 significant digits). */
export function shortestHalf(bits: number): number {
  return shortest(fromHalfBits(bits), 1, 5, (candidate) => toHalfBits(candidate) === bits);
}

/** A bfloat16 bit pattern as its shortest round-tripping decimal (at most 4 significant digits). */
export function shortestBfloat16(bits: number): number {
  return shortest(fromBfloat16Bits(bits), 1, 4, (candidate) => toBfloat16Bits(candidate) === bits);
}
