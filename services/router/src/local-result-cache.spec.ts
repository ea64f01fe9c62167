import { create } from '@bufbuild/protobuf';
import { InferenceResponseSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { LocalResultCache } from './local-result-cache';

/** A response whose output holds `bytes` bytes (256 more are charged per entry). */
const response = (id: string, bytes: number) => create(InferenceResponseSchema, { id, outputs: [{ name: 'y', data: new Uint8Array(bytes) }] });

describe(LocalResultCache.name, () => {
  let now = 0;
  const clock = () => now;

  it('answers what it holds until it expires', () => {
    const sut = new LocalResultCache(10_000, 100, clock);
    sut.set('a', response('a', 10));
    expect(sut.get('a')?.id).toBe('a');
    now += 100;
    expect(sut.get('a')).toBeUndefined();
    expect(sut.size).toBe(0);
  });

  it('drops the least recently used entries beyond its byte budget', () => {
    const sut = new LocalResultCache(3 * (256 + 100), 60_000, clock);
    for (const key of ['a', 'b', 'c']) sut.set(key, response(key, 100));
    sut.get('a');
    sut.set('d', response('d', 100));
    expect(['a', 'b', 'c', 'd'].map((k) => sut.get(k)?.id)).toEqual(['a', undefined, 'c', 'd']);
    expect(sut.size).toBe(3 * 356);
  });

  it('does not hold an entry larger than its budget, and charges a replaced entry once', () => {
    const sut = new LocalResultCache(1_000, 60_000, clock);
    sut.set('big', response('big', 1_000));
    expect(sut.get('big')).toBeUndefined();
    sut.set('a', response('a', 10));
    sut.set('a', response('a2', 20));
    expect(sut.get('a')?.id).toBe('a2');
    expect(sut.size).toBe(276);
  });
});
