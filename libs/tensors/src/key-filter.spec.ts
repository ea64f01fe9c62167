import { randomBytes } from 'node:crypto';
import { FINGERPRINT_BYTES, KeyFilter } from './key-filter';

describe(KeyFilter.name, () => {
  const keys = (n: number) => Array.from({ length: n }, () => randomBytes(32));

  it('has every key added, and lacks nearly every other at its capacity', () => {
    const sut = KeyFilter.sized(20_000);
    const added = keys(20_000);
    for (const key of added) sut.add(key);
    expect(added.every((key) => sut.has(key))).toBe(true);
    const others = keys(20_000).filter((key) => sut.has(key)).length;
    // 10 bits and 7 bits set a key: 0.8 % expected.
    expect(others / 20_000).toBeLessThan(0.015);
    expect(others).toBeGreaterThan(0);
  });

  it('places a fingerprint where it places its key, on another filter of the same bits', () => {
    const sut = KeyFilter.sized(1_000);
    const added = keys(500);
    sut.addFingerprints(Buffer.concat(added.map((key) => key.subarray(0, FINGERPRINT_BYTES))));
    const copy = new KeyFilter(sut.bits.slice(), sut.hashes);
    expect(added.every((key) => copy.has(key))).toBe(true);
    const direct = KeyFilter.sized(1_000);
    for (const key of added) direct.add(key);
    expect(Buffer.from(direct.bits)).toEqual(Buffer.from(sut.bits));
  });

  it('lacks every key while empty', () => {
    const sut = KeyFilter.sized(100);
    expect(keys(1_000).some((key) => sut.has(key))).toBe(false);
  });

  it('refuses a filter, fingerprints or a key it cannot use, naming what is wrong', () => {
    expect(() => new KeyFilter(new Uint8Array(0), 7)).toThrow('at least one byte of bits');
    expect(() => new KeyFilter(new Uint8Array(8), 0)).toThrow('1 to 16 bits per key, not 0');
    expect(() => new KeyFilter(new Uint8Array(8), 17)).toThrow('1 to 16 bits per key, not 17');
    const sut = KeyFilter.sized(10);
    expect(() => sut.addFingerprints(new Uint8Array(12))).toThrow('8 bytes each; got 12 bytes');
    expect(() => sut.has(new Uint8Array(4))).toThrow('at least 8 bytes');
    expect(() => sut.add(new Uint8Array(4))).toThrow('at least 8 bytes');
  });
});
