import { create } from '@bufbuild/protobuf';
import { InferenceResponseSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ManualClock } from '@infermesh/testing';
import { chargeOf, ENTRY_OVERHEAD_BYTES, LocalResultCache, OUTPUT_OVERHEAD_BYTES } from './local-result-cache';

/** A response whose output "y" holds `bytes` bytes. */
const response = (id: string, bytes: number) =>
  create(InferenceResponseSchema, { id, outputs: [{ name: 'y', data: new Uint8Array(bytes) }] });
/** What a one-character key and a response of `bytes` bytes are charged. */
const charge = (bytes: number) => ENTRY_OVERHEAD_BYTES + 2 + OUTPUT_OVERHEAD_BYTES + 2 + bytes;

describe(LocalResultCache.name, () => {
  const clock = new ManualClock();

  it('answers what it holds until it expires', () => {
    const sut = new LocalResultCache(10_000, 100, clock);
    sut.set('a', response('a', 10));
    clock.advance(99);
    expect(sut.get('a')?.id).toBe('a');
    clock.advance(2);
    expect(sut.get('a')).toBeUndefined();
    expect(sut.size).toBe(0);
  });

  it('drops the least recently used entries beyond its byte budget', () => {
    const sut = new LocalResultCache(3 * charge(100), 60_000, clock);
    for (const key of ['a', 'b', 'c']) sut.set(key, response(key, 100));
    sut.get('a');
    sut.set('d', response('d', 100));
    expect(['a', 'b', 'c', 'd'].map((k) => sut.get(k)?.id)).toEqual(['a', undefined, 'c', 'd']);
    expect(sut.size).toBe(3 * charge(100));
  });

  it('does not hold an entry larger than its budget, and charges a replaced entry once', () => {
    const sut = new LocalResultCache(charge(100), 60_000, clock);
    sut.set('big', response('big', 101));
    expect(sut.get('big')).toBeUndefined();
    sut.set('a', response('a', 10));
    sut.set('a', response('a2', 20));
    expect(sut.get('a')?.id).toBe('a2');
    expect(sut.size).toBe(charge(20));
  });

  it('charges each entry its key, its outputs (bytes, names, shapes) and a fixed overhead', () => {
    const two = create(InferenceResponseSchema, {
      outputs: [
        { name: 'scores', shape: [1n, 5n], data: new Uint8Array(20) },
        { name: 'ids', shape: [1n], data: new Uint8Array(8) },
      ],
    });
    expect(chargeOf('k'.repeat(64), two)).toBe(
      ENTRY_OVERHEAD_BYTES + 128 + 2 * OUTPUT_OVERHEAD_BYTES + 12 + 6 + 16 + 8 + 20 + 8,
    );
  });

  it('keeps a copy of exact size of outputs that are views into a larger buffer, so the buffer they came in is not held', () => {
    const message = new Uint8Array(64 * 1024);
    message.fill(7, 100, 108);
    const received = create(InferenceResponseSchema, {
      id: 'r',
      outputs: [{ name: 'y', data: message.subarray(100, 108) }],
    });
    const sut = new LocalResultCache(1 << 20, 60_000, clock);

    sut.set('r', received);

    const held = sut.get('r')!.outputs[0]!.data;
    expect(held.buffer.byteLength).toBe(8);
    expect([...held]).toEqual(Array(8).fill(7));
  });
});
