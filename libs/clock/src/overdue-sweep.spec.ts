import { ManualClock } from './manual-clock.testing';
import { OverdueSweep } from './overdue-sweep';

describe(OverdueSweep.name, () => {
  it('calls what is still watched a timeout after it was watched, within 1.25 timeouts, once', () => {
    const clock = new ManualClock();
    const sut = new OverdueSweep<string>(clock, 1_000);
    const overdue: [string, number][] = [];
    sut.watch('late', () => overdue.push(['late', clock.monotonic()]));
    clock.advance(100);
    sut.watch('in time', () => overdue.push(['in time', clock.monotonic()]));
    clock.advance(600);
    sut.forget('in time');

    clock.advance(299);
    expect(overdue).toEqual([]);
    clock.advance(1);
    expect(overdue).toEqual([['late', 1_000]]);
    expect(sut.size).toBe(0);
    clock.advance(10_000);
    expect(overdue).toEqual([['late', 1_000]]);
  });

  it('with a begun test, counts the timeout from the first check that finds it begun', () => {
    const clock = new ManualClock();
    const sut = new OverdueSweep<number>(clock, 1_000);
    let begun = false;
    const overdue: number[] = [];
    sut.watch(
      1,
      () => overdue.push(clock.monotonic()),
      () => begun,
    );

    clock.advance(5_000);
    expect(overdue).toEqual([]);
    begun = true;
    clock.advance(250); // the check at 5,250 sees it begun
    clock.advance(999);
    expect(overdue).toEqual([]);
    clock.advance(1);
    expect(overdue).toEqual([6_250]);
  });

  it('starts over when a key is watched again, and close() stops everything', () => {
    const clock = new ManualClock();
    const sut = new OverdueSweep<string>(clock, 400);
    const overdue: number[] = [];
    sut.watch('a', () => overdue.push(clock.monotonic()));
    clock.advance(300);
    sut.watch('a', () => overdue.push(clock.monotonic()));
    clock.advance(300);
    expect(overdue).toEqual([]);
    clock.advance(100);
    expect(overdue).toEqual([700]);

    sut.watch('b', () => overdue.push(-1));
    sut.close();
    clock.advance(10_000);
    expect(overdue).toEqual([700]);
    expect(clock.pendingInMs()).toEqual([]);
  });

  it('at maxWatched, gives up the key watched longest to watch another, and counts the rest from their own start', () => {
    const clock = new ManualClock();
    const sut = new OverdueSweep<string>(clock, 1_000, 3);
    const given: string[] = [];
    const watch = (key: string) => sut.watch(key, (cause) => given.push(`${key} ${cause} ${clock.monotonic()}`));
    watch('a');
    clock.advance(100);
    watch('b');
    watch('c');
    watch('a'); // watched again: now the newest
    expect(sut.size).toBe(3);
    expect(given).toEqual([]);

    watch('d');
    watch('e');
    expect(given).toEqual(['b evicted 100', 'c evicted 100']);
    expect(sut.size).toBe(3);
    sut.forget('d');
    watch('f'); // room again: nothing given up
    expect(given).toHaveLength(2);

    clock.advance(1_049);
    expect(given).toHaveLength(2);
    clock.advance(101); // the check at 1,250: a timeout after 100 (checks every 250 ms)
    expect(given.slice(2)).toEqual(['a timeout 1250', 'e timeout 1250', 'f timeout 1250']);
    expect(sut.size).toBe(0);
  });
});
