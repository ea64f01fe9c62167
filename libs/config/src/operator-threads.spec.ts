import { defaultIntraOpThreads } from './operator-threads';

describe(defaultIntraOpThreads.name, () => {
  it("shares the cores but one (the event loop's) out among the instances, at least one each", () => {
    expect([1, 2, 3, 16].map((cores) => defaultIntraOpThreads(1, cores))).toEqual([1, 1, 2, 15]);
    expect([1, 2, 8, 16].map((cores) => defaultIntraOpThreads(2, cores))).toEqual([1, 1, 3, 7]);
  });
});
