import { systemClock } from './clock';
import { ManualClock } from './manual-clock.testing';

describe(ManualClock.name, () => {
  it('moves only when advanced, firing the timers that fall due in order, each at its own time', () => {
    const sut = new ManualClock(Date.UTC(2030, 0, 1));
    const fired: [string, number][] = [];
    sut.setTimer(() => fired.push(['b', sut.monotonic()]), 20);
    sut.setTimer(() => fired.push(['a', sut.monotonic()]), 10);
    const cancel = sut.setTimer(() => fired.push(['cancelled', sut.monotonic()]), 15);

    cancel();
    expect(sut.pendingInMs()).toEqual([10, 20]);
    sut.advance(9);
    expect(fired).toEqual([]);
    sut.advance(11);

    expect(fired).toEqual([
      ['a', 10],
      ['b', 20],
    ]);
    expect(sut.now()).toBe(Date.UTC(2030, 0, 1) + 20);
    expect(sut.date()).toEqual(new Date(Date.UTC(2030, 0, 1) + 20));
  });
});

describe('Clock.setRepeatingTimer', () => {
  it('calls back every period until cancelled, also after a callback that throws', () => {
    const sut = new ManualClock();
    const calls: number[] = [];
    const cancel = sut.setRepeatingTimer(() => {
      calls.push(sut.monotonic());
      if (calls.length === 2) throw new Error('one call failed');
    }, 100);

    sut.advance(150);
    expect(() => sut.advance(50)).toThrow('one call failed');
    sut.advance(100);
    expect(calls).toEqual([100, 200, 300]);

    cancel();
    sut.advance(1_000);
    expect(calls).toEqual([100, 200, 300]);
    expect(sut.pendingInMs()).toEqual([]);
  });

  it('stops when cancelled from its own callback', () => {
    const sut = new ManualClock();
    let calls = 0;
    const cancel = sut.setRepeatingTimer(() => {
      calls += 1;
      cancel();
    }, 10);

    sut.advance(100);

    expect(calls).toBe(1);
    expect(sut.pendingInMs()).toEqual([]);
  });
});

describe('Clock.sleep', () => {
  it('resolves once the time has passed on the clock', async () => {
    const sut = new ManualClock();
    let woke = false;
    const sleeping = sut.sleep(50).then(() => (woke = true));

    sut.advance(49);
    await Promise.resolve();
    expect(woke).toBe(false);
    sut.advance(1);
    await sleeping;

    expect(woke).toBe(true);
  });

  it("rejects with the signal's reason when it aborts, and leaves no timer behind", async () => {
    const sut = new ManualClock();
    const controller = new AbortController();
    const sleeping = sut.sleep(1_000, controller.signal);

    controller.abort(new Error('cancelled'));

    await expect(sleeping).rejects.toThrow('cancelled');
    expect(sut.pendingInMs()).toEqual([]);
    await expect(sut.sleep(10, controller.signal)).rejects.toThrow('cancelled');
    expect(sut.pendingInMs()).toEqual([]);
  });

  it('waits on the system clock by default', async () => {
    await expect(systemClock.sleep(1)).resolves.toBeUndefined();
  });
});
