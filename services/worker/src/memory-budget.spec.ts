import { chooseEvictions, formatBytes } from './memory-budget';

describe(chooseEvictions.name, () => {
  const a = { name: 'a', memoryBytes: 100, lastUsedMs: 3 };
  const b = { name: 'b', memoryBytes: 100, lastUsedMs: 1 };
  const c = { name: 'c', memoryBytes: 50, lastUsedMs: 2 };

  it('evicts nothing when the new model fits', () => {
    expect(chooseEvictions([a, b, c], 250, 50, 300)).toEqual([]);
  });

  it('evicts least recently used first, only as many as needed', () => {
    expect(chooseEvictions([a, b, c], 250, 100, 300)).toEqual([b]);
    expect(chooseEvictions([a, b, c], 250, 200, 300)).toEqual([b, c]);
  });

  it('says undefined when evicting every candidate is not enough', () => {
    expect(chooseEvictions([a, c], 250, 250, 300)).toBeUndefined();
    expect(chooseEvictions([], 0, 301, 300)).toBeUndefined();
  });
});

describe(formatBytes.name, () => {
  it.each([
    [512, '512 B'],
    [25 * 2 ** 20, '25.0 MiB'],
    [1.5 * 2 ** 30, '1.5 GiB'],
  ])('writes %d as %s', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });
});
