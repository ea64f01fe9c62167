/** Bytes of a cache key that place it in a KeyFilter: its fingerprint. */
export const FINGERPRINT_BYTES = 8;
/** Bits a key gets in a filter sized for a capacity, and bits set per key: about 0.8 % false positives when full. */
const BITS_PER_KEY = 10;
const HASHES = 7;
/** The most bit positions a filter may set per key (a filter from elsewhere with more is refused). */
const MAX_HASHES = 16;

/**
 * A Bloom filter of result-cache keys (cache.proto's KeyFilter): it may say it has a key it was never
 * given (about 0.8 % of keys, at its capacity), never that it lacks one it was given. Keys are
 * SHA-256 digests, uniform already, so a key's first 8 bytes place it (double hashing).
 */
export class KeyFilter {
  private readonly size: number;

  constructor(
    readonly bits: Uint8Array,
    readonly hashes: number,
  ) {
    if (bits.byteLength === 0) throw new Error('a key filter needs at least one byte of bits');
    if (!Number.isInteger(hashes) || hashes < 1 || hashes > MAX_HASHES) {
      throw new Error(`a key filter sets 1 to ${MAX_HASHES} bits per key, not ${hashes}`);
    }
    this.size = bits.byteLength * 8;
  }

  /** An empty filter for `capacity` keys. */
  static sized(capacity: number): KeyFilter {
    return new KeyFilter(new Uint8Array(Math.ceil((Math.max(1, capacity) * BITS_PER_KEY) / 8)), HASHES);
  }

  /** Adds a key, or a fingerprint (a key's first FINGERPRINT_BYTES bytes). */
  add(key: Uint8Array): void {
    this.addAt(key, 0);
  }

  /** Adds fingerprints laid one after another (WatchKeysResponse.added). */
  addFingerprints(fingerprints: Uint8Array): void {
    if (fingerprints.byteLength % FINGERPRINT_BYTES !== 0) {
      throw new Error(`fingerprints come in ${FINGERPRINT_BYTES} bytes each; got ${fingerprints.byteLength} bytes`);
    }
    for (let at = 0; at < fingerprints.byteLength; at += FINGERPRINT_BYTES) this.addAt(fingerprints, at);
  }

  /** False when the key was certainly never added. */
  has(key: Uint8Array): boolean {
    if (key.byteLength < FINGERPRINT_BYTES) throw new Error(`a key has at least ${FINGERPRINT_BYTES} bytes`);
    let h = uint32(key, 0);
    const step = (uint32(key, 4) | 1) >>> 0;
    for (let i = 0; i < this.hashes; i++) {
      const bit = h % this.size;
      if ((this.bits[bit >>> 3]! & (1 << (bit & 7))) === 0) return false;
      h += step;
    }
    return true;
  }

  private addAt(bytes: Uint8Array, at: number): void {
    if (bytes.byteLength < at + FINGERPRINT_BYTES) throw new Error(`a key has at least ${FINGERPRINT_BYTES} bytes`);
    let h = uint32(bytes, at);
    const step = (uint32(bytes, at + 4) | 1) >>> 0;
    for (let i = 0; i < this.hashes; i++) {
      const bit = h % this.size;
      this.bits[bit >>> 3]! |= 1 << (bit & 7);
      h += step;
    }
  }
}

/** The little-endian uint32 at `at` (a number, so that sums of a few stay exact). */
function uint32(bytes: Uint8Array, at: number): number {
  return (bytes[at]! | (bytes[at + 1]! << 8) | (bytes[at + 2]! << 16) | (bytes[at + 3]! << 24)) >>> 0;
}
