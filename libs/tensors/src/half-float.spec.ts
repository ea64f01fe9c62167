import {
  fromBfloat16Bits,
  fromHalfBits,
  shortestBfloat16,
  shortestFloat32,
  shortestHalf,
  toBfloat16Bits,
  toHalfBits,
} from './half-float';

/** Deterministic doubles of every magnitude from 2^-30 to 2^20, both signs, with full 53-bit mantissas. */
function* randomDoubles(count: number): Generator<number> {
  let state = 0x9e3779b9;
  const next = () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
  for (let i = 0; i < count; i++) {
    const mantissa = 1 + next() + next() * 2 ** -32;
    const exponent = Math.floor(next() * 50) - 30;
    yield (next() < 0.5 ? -1 : 1) * mantissa * 2 ** exponent;
  }
}

/** Doubles a hair above and below each half-way point between neighbouring finite values. */
function* nearTies(maxFinite: number, decode: (bits: number) => number): Generator<number> {
  for (let bits = 0; bits < maxFinite; bits += 7) {
    const tie = (decode(bits) + decode(bits + 1)) / 2;
    yield tie * (1 + 2 ** -40);
    yield tie * (1 - 2 ** -40);
    yield -tie;
  }
}

/**
 * The reference: the nearest of the two neighbouring finite values (ties to the even pattern), or
 * infinity past the largest one's rounding limit. Positive values only; patterns 0..maxFinite are ordered.
 */
function nearest(value: number, maxFinite: number, decode: (bits: number) => number, infinity: number): number {
  let lo = 0;
  let hi = maxFinite;
  if (value >= decode(maxFinite)) {
    const limit = decode(maxFinite) + (decode(maxFinite) - decode(maxFinite - 1)) / 2;
    return value < limit ? maxFinite : infinity;
  }
  while (hi - lo > 1) {
    const mid = (lo + hi) >>> 1;
    if (decode(mid) <= value) lo = mid;
    else hi = mid;
  }
  const below = value - decode(lo);
  const above = decode(hi) - value;
  if (below < above) return lo;
  if (above < below) return hi;
  return lo % 2 === 0 ? lo : hi;
}

describe('toHalfBits', () => {
  it.each([
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2, 0xc000],
    [0.5, 0x3800],
    [1 / 3, 0x3555],
    [65504, 0x7bff],
    [2 ** -14, 0x0400], // smallest normal
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -15, 0x0200],
    [-(2 ** -24), 0x8001],
  ])('encodes %p', (value, bits) => {
    expect(toHalfBits(value)).toBe(bits);
  });

  it('rounds to the nearest half, ties to even', () => {
    const ulp = 2 ** -10; // at 1.0
    expect(toHalfBits(1 + ulp / 2)).toBe(0x3c00); // tie, 0x3c00 is even
    expect(toHalfBits(1 + 3 * (ulp / 2))).toBe(0x3c02); // tie, 0x3c02 is even
    expect(toHalfBits(1 + ulp / 2 + ulp / 8)).toBe(0x3c01); // above the tie
    expect(toHalfBits(1 + ulp / 2 - ulp / 8)).toBe(0x3c00); // below the tie
  });

  it('rounds a value a hair off a tie by the value itself, not by its float32 rounding', () => {
    const ulp = 2 ** -10;
    expect(toHalfBits(1 + ulp / 2 + 2 ** -40)).toBe(0x3c01);
    expect(toHalfBits(1 + 3 * (ulp / 2) - 2 ** -40)).toBe(0x3c01);
    expect(toHalfBits(65520 - 2 ** -20)).toBe(0x7bff);
  });

  it('agrees with exact rounding to nearest even on random doubles and on doubles a hair off every tie', () => {
    for (const value of [...randomDoubles(20_000), ...nearTies(0x7bff, fromHalfBits)]) {
      const expected = (value < 0 ? 0x8000 : 0) | nearest(Math.abs(value), 0x7bff, fromHalfBits, 0x7c00);
      if (toHalfBits(value) !== expected)
        throw new Error(`${value}: 0x${toHalfBits(value).toString(16)}, expected 0x${expected.toString(16)}`);
    }
  });

  it('rounds subnormals to nearest even and underflows to signed zero', () => {
    expect(toHalfBits(1.5 * 2 ** -24)).toBe(0x0002); // tie between 1 and 2 ulps: even
    expect(toHalfBits(2.5 * 2 ** -24)).toBe(0x0002);
    expect(toHalfBits(2 ** -25)).toBe(0x0000); // tie with zero: even
    expect(toHalfBits(2 ** -25 * 1.01)).toBe(0x0001);
    expect(toHalfBits(2 ** -30)).toBe(0x0000);
    expect(toHalfBits(-(2 ** -30))).toBe(0x8000);
  });

  it('carries a rounded-up mantissa into the exponent', () => {
    expect(toHalfBits(2 - 2 ** -12)).toBe(0x4000);
    expect(toHalfBits(2 ** -14 - 2 ** -26)).toBe(0x0400); // largest subnormal rounds up to smallest normal
  });

  it('overflows to infinity past the largest half', () => {
    expect(toHalfBits(65519)).toBe(0x7bff);
    expect(toHalfBits(65520)).toBe(0x7c00);
    expect(toHalfBits(1e6)).toBe(0x7c00);
    expect(toHalfBits(-1e6)).toBe(0xfc00);
    expect(toHalfBits(Infinity)).toBe(0x7c00);
    expect(toHalfBits(-Infinity)).toBe(0xfc00);
  });

  it('keeps NaN a NaN', () => {
    const bits = toHalfBits(NaN);
    expect(bits & 0x7c00).toBe(0x7c00);
    expect(bits & 0x03ff).not.toBe(0);
  });
});

describe('fromHalfBits', () => {
  it('decodes normals, subnormals, zeros, infinities and NaN', () => {
    expect(fromHalfBits(0x3c00)).toBe(1);
    expect(fromHalfBits(0xc000)).toBe(-2);
    expect(fromHalfBits(0x7bff)).toBe(65504);
    expect(fromHalfBits(0x0001)).toBe(2 ** -24);
    expect(fromHalfBits(0x03ff)).toBe(1023 * 2 ** -24);
    expect(Object.is(fromHalfBits(0x8000), -0)).toBe(true);
    expect(fromHalfBits(0x7c00)).toBe(Infinity);
    expect(fromHalfBits(0xfc00)).toBe(-Infinity);
    expect(fromHalfBits(0x7e00)).toBeNaN();
  });

  it('round-trips every finite half exactly', () => {
    for (let bits = 0; bits <= 0xffff; bits++) {
      if ((bits & 0x7c00) === 0x7c00) continue;
      const value = fromHalfBits(bits);
      if (toHalfBits(value) !== bits)
        throw new Error(`0x${bits.toString(16)} -> ${value} -> 0x${toHalfBits(value).toString(16)}`);
    }
  });
});

describe('toBfloat16Bits', () => {
  it.each([
    [1, 0x3f80],
    [-2, 0xc000],
    [0, 0x0000],
    [3.140625, 0x4049],
    [Infinity, 0x7f80],
    [-Infinity, 0xff80],
  ])('encodes %p', (value, bits) => {
    expect(toBfloat16Bits(value)).toBe(bits);
  });

  it('rounds to the nearest bfloat16, ties to even', () => {
    const ulp = 2 ** -7;
    expect(toBfloat16Bits(1 + ulp / 2)).toBe(0x3f80);
    expect(toBfloat16Bits(1 + 3 * (ulp / 2))).toBe(0x3f82);
    expect(toBfloat16Bits(1 + ulp / 2 + ulp / 8)).toBe(0x3f81);
  });

  it('rounds a value a hair off a tie by the value itself, not by its float32 rounding', () => {
    expect(toBfloat16Bits(1 + 2 ** -8 + 2 ** -40)).toBe(0x3f81);
    expect(toBfloat16Bits(1 + 3 * 2 ** -8 - 2 ** -40)).toBe(0x3f81);
  });

  it('agrees with exact rounding to nearest even on random doubles and on doubles a hair off every tie', () => {
    for (const value of [...randomDoubles(20_000), ...nearTies(0x7f7f, fromBfloat16Bits)]) {
      const expected = (value < 0 ? 0x8000 : 0) | nearest(Math.abs(value), 0x7f7f, fromBfloat16Bits, 0x7f80);
      if (toBfloat16Bits(value) !== expected)
        throw new Error(`${value}: 0x${toBfloat16Bits(value).toString(16)}, expected 0x${expected.toString(16)}`);
    }
  });

  it('overflows to infinity past the largest bfloat16 and keeps NaN a NaN', () => {
    expect(toBfloat16Bits(3.4e38)).toBe(0x7f80);
    expect(Number.isNaN(fromBfloat16Bits(toBfloat16Bits(NaN)))).toBe(true);
  });

  it('round-trips every finite bfloat16 exactly', () => {
    for (let bits = 0; bits <= 0xffff; bits++) {
      if ((bits & 0x7f80) === 0x7f80) continue;
      const value = fromBfloat16Bits(bits);
      if (toBfloat16Bits(value) !== bits)
        throw new Error(`0x${bits.toString(16)} -> ${value} -> 0x${toBfloat16Bits(value).toString(16)}`);
    }
  });
});

describe('shortest decimal forms', () => {
  it('writes float32 values with the fewest digits that read back to the same bits', () => {
    expect(shortestFloat32(Math.fround(0.1))).toBe(0.1);
    expect(shortestFloat32(Math.fround(3.8))).toBe(3.8);
    expect(shortestFloat32(Math.fround(1 / 3))).toBe(0.33333334);
    expect(shortestFloat32(16777216)).toBe(16777216);
    expect(shortestFloat32(Math.fround(3.4028234663852886e38))).toBe(3.4028235e38);
    // Subnormals keep a correct, if not always shortest, form.
    expect(Math.fround(shortestFloat32(Math.fround(1.401298464324817e-45)))).toBe(Math.fround(1e-45));
    expect(shortestFloat32(Infinity)).toBe(Infinity);
  });

  it('round-trips every float32 it shortens, bit for bit', () => {
    const bits = new Uint32Array(1);
    const view = new Float32Array(bits.buffer);
    let state = 12345;
    for (let i = 0; i < 20_000; i++) {
      state = (Math.imul(state, 1103515245) + 12345) >>> 0;
      bits[0] = state;
      const value = view[0]!;
      if (!Number.isFinite(value)) continue;
      const short = shortestFloat32(value);
      expect(Math.fround(short)).toBe(value);
      expect(String(short).length).toBeLessThanOrEqual(String(value).length);
    }
  });

  it('round-trips every FP16 and BF16 pattern', () => {
    for (let bits = 0; bits < 0x10000; bits++) {
      const half = shortestHalf(bits);
      if (Number.isFinite(half)) expect(toHalfBits(half)).toBe(bits === 0x8000 ? 0x8000 : bits);
      const bf = shortestBfloat16(bits);
      if (Number.isFinite(bf)) expect(toBfloat16Bits(bf)).toBe(bits);
    }
    expect(shortestHalf(toHalfBits(0.1))).toBe(0.1);
    expect(shortestBfloat16(toBfloat16Bits(0.1))).toBe(0.1);
  });
});
