import { leastOutstanding, powerOfTwo, replicaChoice } from './replica-choice';

const workers = (...outstanding: number[]) => outstanding.map((n, i) => ({ id: i, outstanding: n }));

/** A random source that returns the given values in turn. */
const sequence = (...values: number[]) => {
  let i = 0;
  return () => values[i++ % values.length]!;
};

describe('replica choice', () => {
  it('least outstanding: the worker with the fewest batches, the first listed on a tie', () => {
    expect(leastOutstanding.choose(workers(2, 1, 0, 0)).id).toBe(2);
    expect(leastOutstanding.choose(workers(1, 1)).id).toBe(0);
    expect(leastOutstanding.choose(workers(3)).id).toBe(0);
  });

  it('power of two: the less busy of two different workers drawn at random', () => {
    // Draws index 0, then index 2 of the other three (index 3 of all): 3 outstanding against 0.
    expect(powerOfTwo(sequence(0, 0.99)).choose(workers(3, 2, 1, 0)).id).toBe(3);
    // Draws index 1, then index 0 of the others: 2 against 3.
    expect(powerOfTwo(sequence(0.3, 0)).choose(workers(3, 2, 1, 0)).id).toBe(1);
    // The same random value twice still draws two different workers.
    expect(powerOfTwo(sequence(0.5, 0.5)).choose(workers(5, 4)).id).toBe(1);
    expect(powerOfTwo(sequence(0.5, 0.5)).choose(workers(4, 5)).id).toBe(0);
    expect(powerOfTwo(() => 0.7).choose(workers(9)).id).toBe(0);
  });

  it('power of two never picks the busiest of several, and spreads ties over all of them', () => {
    const sut = powerOfTwo();
    const picks = new Map<number, number>();
    for (let i = 0; i < 3_000; i++) {
      const id = sut.choose(workers(0, 0, 0, 7)).id;
      picks.set(id, (picks.get(id) ?? 0) + 1);
    }
    expect(picks.has(3)).toBe(false);
    for (const id of [0, 1, 2]) expect(picks.get(id)).toBeGreaterThan(600);
  });

  it('is chosen by name', () => {
    expect(replicaChoice('least_outstanding').name).toBe('least_outstanding');
    expect(replicaChoice('power_of_two').name).toBe('power_of_two');
  });
});
