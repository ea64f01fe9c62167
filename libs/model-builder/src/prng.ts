/**
 * A small seeded pseudo-random generator (mulberry32): the same seed gives the same sequence on
 * every machine and every run, so generated weights are byte-identical.
 */
export class SeededRandom {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** A number in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** `count` float32 values drawn uniformly from [low, high). */
  uniformFloat32(count: number, low: number, high: number): Float32Array {
    const out = new Float32Array(count);
    const span = high - low;
    for (let i = 0; i < count; i += 1) out[i] = low + span * this.next();
    return out;
  }
}
