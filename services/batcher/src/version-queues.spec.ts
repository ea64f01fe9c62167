import { names, pending, policy } from './testing/pending-requests';
import { VersionQueue, VersionQueues } from './version-queues';

describe(VersionQueue.name, () => {
  const open = (priorityLevels = 1) =>
    new VersionQueue(
      'models/mlp/versions/1',
      'mlp',
      '1',
      policy({ priorityLevels, defaultPriorityLevel: priorityLevels }),
    );

  it('serves by priority level, then arrival, and counts the items ahead of each level', () => {
    const sut = open(3);
    const entries = [
      pending('low', { level: 3, items: 4 }),
      pending('mid', { level: 2, items: 2 }),
      pending('high', { level: 1, items: 1 }),
      pending('mid-2', { level: 2, items: 3 }),
    ];
    for (const entry of entries) sut.add(entry);

    expect(names(sut.inOrder())).toEqual(['high', 'mid', 'mid-2', 'low']);
    expect(names([sut.head()!])).toEqual(['high']);
    expect([sut.itemsAhead(1), sut.itemsAhead(2), sut.itemsAhead(3)]).toEqual([1, 6, 10]);
    expect(sut.length).toBe(4);
  });

  it('finds the request that has waited longest, whatever its level', () => {
    const sut = open(2);
    sut.add(pending('old-low', { level: 2, arrivedAtMs: 10 }));
    sut.add(pending('new-high', { level: 1, arrivedAtMs: 50 }));

    expect(names([sut.oldest()!])).toEqual(['old-low']);
    expect(names([sut.head()!])).toEqual(['new-high']);
  });

  it('forgets a removed request once, and is empty without a head or an oldest', () => {
    const sut = open();
    const entry = pending('a', { items: 3 });
    sut.add(entry);

    sut.remove(entry);
    sut.remove(entry);

    expect([sut.length, sut.itemsAhead(1), sut.head(), sut.oldest(), entry.queued]).toEqual([
      0,
      0,
      undefined,
      undefined,
      false,
    ]);
  });

  it('keeps its requests when the version’s priority levels shrink, each at most at the new lowest level', () => {
    const sut = open(3);
    for (const entry of [pending('low', { level: 3 }), pending('mid', { level: 2 }), pending('high', { level: 1 })])
      sut.add(entry);

    sut.adopt(policy({ priorityLevels: 2, defaultPriorityLevel: 2 }));

    expect(names(sut.inOrder())).toEqual(['high', 'mid', 'low']);
    expect([...sut.inOrder()].map((e) => e.level)).toEqual([1, 2, 2]);
    expect([sut.length, sut.itemsAhead(2)]).toEqual([3, 3]);
  });
});

describe(VersionQueues.name, () => {
  it('makes one queue per version on first use, and has the models of those it made', () => {
    const sut = new VersionQueues();
    const first = policy();

    const queue = sut.open('models/mlp/versions/1', 'mlp', '1', first);

    expect(sut.open('models/mlp/versions/1', 'mlp', '1', first)).toBe(queue);
    expect([sut.has('models/mlp/versions/1'), sut.has('models/mlp/versions/2')]).toEqual([true, false]);
    expect([sut.hasModel('mlp'), sut.hasModel('other')]).toEqual([true, false]);
    expect([...sut]).toEqual([queue]);
  });

  it("gives an existing queue the version's changed policy", () => {
    const sut = new VersionQueues();
    const queue = sut.open('models/mlp/versions/1', 'mlp', '1', policy());
    const changed = policy({ maxBatchSize: 2 });

    sut.open('models/mlp/versions/1', 'mlp', '1', changed);

    expect(queue.policy).toBe(changed);
  });
});
