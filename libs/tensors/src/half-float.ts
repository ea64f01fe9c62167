const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** IEEE 754 half-precision bits of a number, rounding to nearest even. */
export function toHalfBits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  // Rounding to float32 first can land a value just off a tie on the tie itself; which way it moved
  // then decides, so the result is the one rounding the value once would give.
  const moved = Math.abs(value) - Math.abs(f32[0]);
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0); // Inf / NaN
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow to infinity
  if (e <= 0) {
    if (e < -10) return sign; // underflow to zero
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rest > halfway || (rest === halfway && (moved > 0 || (moved === 0 && (half & 1) !== 0)))) half += 1;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (moved > 0 || (moved === 0 && (half & 1) !== 0)))) half += 1; // may carry into the exponent: still correct
  e = half;
  return sign | e;
}

/** The number a half-precision bit pattern stands for. */
export function fromHalfBits(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** bfloat16 bits of a number, rounding to nearest even. */
export function toBfloat16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x40) & 0xffff; // NaN stays NaN
  const moved = Math.abs(value) - Math.abs(f32[0]); // as in toHalfBits
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
