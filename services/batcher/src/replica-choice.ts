/** What a replica choice looks at in a worker: the batches it runs now. */
export interface Replica {
  readonly outstanding: number;
}

/**
 * How the batcher picks the worker for a batch among those that hold its version (BATCHER_REPLICA_CHOICE).
 * `choose` gets the candidates that have room (fewer than the per-worker limit outstanding) and
 * returns one; the batcher calls it with at least one.
 */
export interface ReplicaChoice {
  readonly name: ReplicaChoiceName;
  choose<R extends Replica>(candidates: readonly R[]): R;
}

export const REPLICA_CHOICES = ['least_outstanding', 'power_of_two'] as const;
export type ReplicaChoiceName = (typeof REPLICA_CHOICES)[number];

/** The worker with the fewest batches outstanding, the first listed on a tie: the best spread, at a scan of every candidate. */
export const leastOutstanding: ReplicaChoice = {
  name: 'least_outstanding',
  choose(candidates) {
    let best = candidates[0]!;
    for (const c of candidates) if (c.outstanding < best.outstanding) best = c;
    return best;
  },
};

/**
 * Power of two choices: of two workers drawn at random, the one with fewer batches outstanding. Near
 * the least-outstanding spread at a constant cost, and, with many batchers, it keeps them from all
 * sending to the one worker each saw least busy (Mitzenmacher; Envoy's LEAST_REQUEST with choice_count 2).
 */
export function powerOfTwo(random: () => number = Math.random): ReplicaChoice {
  return {
    name: 'power_of_two',
    choose(candidates) {
      if (candidates.length === 1) return candidates[0]!;
      const first = Math.floor(random() * candidates.length);
      // The second is another one: drawn among the others, then shifted past the first.
      let second = Math.floor(random() * (candidates.length - 1));
      if (second >= first) second += 1;
      const a = candidates[first]!;
      const b = candidates[second]!;
      return b.outstanding < a.outstanding ? b : a;
    },
  };
}

/** The Nest token of the batcher's ReplicaChoice: the strategy BATCHER_REPLICA_CHOICE names. */
export const REPLICA_CHOICE = Symbol('REPLICA_CHOICE');

/** The strategy a configuration names. */
export function replicaChoice(name: ReplicaChoiceName, random?: () => number): ReplicaChoice {
  return name === 'power_of_two' ? powerOfTwo(random) : leastOutstanding;
}
