import { ManualClock } from '@infermesh/testing';
import type { OutlierDetection } from './mesh-policy';
import { type CallOutcome, OutlierDetector, SWEEP_SLACK_MS } from './outlier-detector';

const INTERVAL = 10_000;
const BASE = 30_000;

/** Consecutive rules at 5 and 3, a 10 s interval, 30 s ejections, no cap; the rest from overrides. */
function settings(overrides: Partial<OutlierDetection> = {}): OutlierDetection {
  return {
    consecutiveFailures: 5,
    consecutiveGatewayFailures: 3,
    interval: INTERVAL,
    baseEjectionTime: BASE,
    maxEjectionPercent: 100,
    ...overrides,
  };
}

/** A detector on a fake clock that starts at 0, with endpoints a, b, c and d unless told. */
function setup(overrides: Partial<OutlierDetection> = {}, endpoints: string[] = ['a', 'b', 'c', 'd']) {
  const clock = new ManualClock();
  const sut = new OutlierDetector<string>(settings(overrides), clock);
  sut.setEndpoints(endpoints);
  return {
    sut,
    now: () => clock.monotonic(),
    /** Moves the clock on to `at` ms and sweeps. */
    sweepAt(at: number): string[] {
      if (at < clock.monotonic()) throw new Error(`time does not go back: ${at} ms is past`);
      clock.advance(at - clock.monotonic());
      return sut.sweep();
    },
  };
}

type Setup = ReturnType<typeof setup>;

/** What record() answered for each of `n` calls with this outcome. */
function recordN(sut: OutlierDetector<string>, key: string, outcome: CallOutcome, n: number): boolean[] {
  return Array.from({ length: n }, () => sut.record(key, outcome));
}

/** Records this many successful and failed calls of the endpoint. */
function calls(sut: OutlierDetector<string>, key: string, successes: number, failures: number): void {
  recordN(sut, key, 'success', successes);
  recordN(sut, key, 'failure', failures);
}

/** Ejects the endpoint now with consecutive failures (the settings' default of 5). */
function eject(t: Setup, key: string): void {
  expect(recordN(t.sut, key, 'failure', 5)).toEqual([false, false, false, false, true]);
}

/** Ejects the endpoint now and checks the ejection lasts `ms`: still on a millisecond before the sweep slack, over at it. */
function expectEjectionLasts(t: Setup, key: string, ms: number): void {
  const start = t.now();
  eject(t, key);
  t.sweepAt(start + ms - SWEEP_SLACK_MS - 1);
  expect(t.sut.isEjected(key)).toBe(true);
  t.sweepAt(start + ms - SWEEP_SLACK_MS);
  expect(t.sut.isEjected(key)).toBe(false);
}

describe('OutlierDetector', () => {
  describe('consecutive failures', () => {
    it('ejects an endpoint on the failure that completes the run, not one before', () => {
      const { sut } = setup();

      expect(recordN(sut, 'a', 'failure', 4)).toEqual([false, false, false, false]);
      expect(sut.isEjected('a')).toBe(false);
      expect(sut.record('a', 'failure')).toBe(true);

      expect(sut.isEjected('a')).toBe(true);
      expect(sut.isEjected('b')).toBe(false);
      expect(sut.activeEjections).toBe(1);
      expect(sut.ejections).toEqual({
        consecutive_failures: 1,
        consecutive_gateway_failures: 0,
        failure_percentage: 0,
        success_rate: 0,
      });
    });

    it('counts gateway failures as failures too', () => {
      const { sut } = setup();

      // The plain failures break the gateway run, so only consecutiveFailures can be met.
      expect(
        ['gateway_failure', 'failure', 'gateway_failure', 'failure', 'gateway_failure'].map((o) =>
          sut.record('a', o as CallOutcome),
        ),
      ).toEqual([false, false, false, false, true]);
      expect(sut.ejections.consecutive_failures).toBe(1);
      expect(sut.ejections.consecutive_gateway_failures).toBe(0);
    });

    it('starts the run over on a success', () => {
      const { sut } = setup();

      recordN(sut, 'a', 'failure', 4);
      sut.record('a', 'success');
      expect(recordN(sut, 'a', 'failure', 4)).toEqual([false, false, false, false]);
      expect(sut.record('a', 'failure')).toBe(true);
    });

    it('is off at 0', () => {
      const { sut } = setup({ consecutiveFailures: 0 });

      expect(recordN(sut, 'a', 'failure', 100).some((ejected) => ejected)).toBe(false);
      expect(sut.isEjected('a')).toBe(false);
    });

    it('keeps each endpoint its own run', () => {
      const { sut } = setup();

      for (let i = 0; i < 4; i++) {
        sut.record('a', 'failure');
        sut.record('b', 'failure');
      }
      expect(sut.record('b', 'failure')).toBe(true);
      expect(sut.isEjected('a')).toBe(false);
      expect(sut.record('a', 'failure')).toBe(true);
    });

    it('does not eject an endpoint again while it is ejected', () => {
      const { sut } = setup();
      recordN(sut, 'a', 'failure', 5);

      expect(recordN(sut, 'a', 'failure', 20).some((ejected) => ejected)).toBe(false);
      expect(sut.ejections.consecutive_failures).toBe(1);
      expect(sut.activeEjections).toBe(1);
    });
  });

  describe('consecutive gateway failures', () => {
    it('ejects an endpoint on the gateway failure that completes the run, not one before', () => {
      const { sut } = setup({ consecutiveFailures: 0 });

      expect(recordN(sut, 'a', 'gateway_failure', 3)).toEqual([false, false, true]);
      expect(sut.ejections).toEqual({
        consecutive_failures: 0,
        consecutive_gateway_failures: 1,
        failure_percentage: 0,
        success_rate: 0,
      });
    });

    it('starts the run over on a success or a plain failure (as Envoy)', () => {
      const { sut } = setup({ consecutiveFailures: 0 });

      expect(
        [
          'gateway_failure',
          'gateway_failure',
          'success',
          'gateway_failure',
          'gateway_failure',
          'failure',
          'gateway_failure',
          'gateway_failure',
        ]
          .map((o) => sut.record('a', o as CallOutcome))
          .some((e) => e),
      ).toBe(false);
      expect(sut.record('a', 'gateway_failure')).toBe(true);
    });

    it('is credited with an ejection when both runs complete on the same call', () => {
      const { sut } = setup({ consecutiveFailures: 3, consecutiveGatewayFailures: 3 });

      expect(recordN(sut, 'a', 'gateway_failure', 3)).toEqual([false, false, true]);
      expect(sut.ejections.consecutive_gateway_failures).toBe(1);
      expect(sut.ejections.consecutive_failures).toBe(0);
    });

    it('starts the run over when the max ejection percent stopped its ejection (as Envoy)', () => {
      const t = setup({ consecutiveFailures: 0, maxEjectionPercent: 50 }, ['a', 'b']);
      expect(recordN(t.sut, 'a', 'gateway_failure', 3).at(-1)).toBe(true);
      expect(recordN(t.sut, 'b', 'gateway_failure', 3).at(-1)).toBe(false); // capped

      t.sweepAt(BASE); // a is back
      expect(recordN(t.sut, 'b', 'gateway_failure', 3)).toEqual([false, false, true]);
    });

    it('is off at 0', () => {
      const { sut } = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0 });

      expect(recordN(sut, 'a', 'gateway_failure', 100).some((ejected) => ejected)).toBe(false);
    });
  });

  describe('max ejection percent', () => {
    it('ejects only while the share already ejected is under it', () => {
      const { sut } = setup({ maxEjectionPercent: 50 });

      expect(recordN(sut, 'a', 'failure', 5).at(-1)).toBe(true); // 0 % ejected before
      expect(recordN(sut, 'b', 'failure', 5).at(-1)).toBe(true); // 25 %
      expect(recordN(sut, 'c', 'failure', 5).at(-1)).toBe(false); // 50 %: no more

      expect(sut.isEjected('c')).toBe(false);
      expect(sut.activeEjections).toBe(2);
      expect(sut.ejections.consecutive_failures).toBe(2);
    });

    it('lets one endpoint be ejected even when it alone is more than the percent', () => {
      const { sut } = setup({ maxEjectionPercent: 10 });

      expect(recordN(sut, 'a', 'failure', 5).at(-1)).toBe(true); // 25 % of the endpoints, but none was out
      expect(recordN(sut, 'b', 'failure', 5).at(-1)).toBe(false);
    });

    it('ejects nothing at 0', () => {
      const { sut } = setup({ maxEjectionPercent: 0 });

      expect(recordN(sut, 'a', 'failure', 5).at(-1)).toBe(false);
      expect(recordN(sut, 'a', 'gateway_failure', 3).at(-1)).toBe(false);
      expect(sut.activeEjections).toBe(0);
    });

    it('starts a run over when the cap stopped its ejection (as Envoy)', () => {
      const t = setup({ maxEjectionPercent: 50 }, ['a', 'b']);
      eject(t, 'a');
      expect(recordN(t.sut, 'b', 'failure', 5).at(-1)).toBe(false); // capped

      t.sweepAt(BASE); // a is back
      expect(t.sut.isEjected('a')).toBe(false);
      expect(recordN(t.sut, 'b', 'failure', 4)).toEqual([false, false, false, false]);
      expect(t.sut.record('b', 'failure')).toBe(true);
    });

    it('caps the ejections of a sweep too, the worst endpoints first', () => {
      const t = setup({
        consecutiveFailures: 0,
        maxEjectionPercent: 50,
        failurePercentage: { threshold: 50, minimumHosts: 1, requestVolume: 10 },
      });
      calls(t.sut, 'a', 3, 7);
      calls(t.sut, 'b', 2, 8);
      calls(t.sut, 'c', 0, 10);
      calls(t.sut, 'd', 1, 9);

      expect(t.sweepAt(INTERVAL)).toEqual(['c', 'd']);
      expect(t.sut.activeEjections).toBe(2);
    });

    it('counts the endpoints there are now', () => {
      const t = setup({ maxEjectionPercent: 50 });
      eject(t, 'a');
      eject(t, 'b');

      t.sut.setEndpoints(['b', 'c', 'd']); // a, ejected, goes: 1 of 3 is out
      expect(t.sut.activeEjections).toBe(1);
      expect(recordN(t.sut, 'c', 'failure', 5).at(-1)).toBe(true);
      expect(recordN(t.sut, 'd', 'failure', 5).at(-1)).toBe(false); // 2 of 3
    });
  });

  describe('ejection time', () => {
    it('lasts baseEjectionTime the first time, and ends only at a sweep', () => {
      const t = setup();
      eject(t, 'a');

      expect(t.sweepAt(INTERVAL)).toEqual([]);
      expect(t.sut.isEjected('a')).toBe(true);
      t.sweepAt(BASE - SWEEP_SLACK_MS - 1);
      expect(t.sut.isEjected('a')).toBe(true);
      t.sweepAt(BASE - SWEEP_SLACK_MS); // a timer that fires a few ms early still ends it
      expect(t.sut.isEjected('a')).toBe(false);
      expect(t.sut.activeEjections).toBe(0);

      const late = setup();
      eject(late, 'a');
      late.sweepAt(INTERVAL);
      expect(late.sut.isEjected('a')).toBe(true);
      // No sweep, however long: still ejected.
      expect(late.sut.record('a', 'success')).toBe(false);
      expect(late.sut.isEjected('a')).toBe(true);
      late.sweepAt(10 * BASE);
      expect(late.sut.isEjected('a')).toBe(false);
    });

    it('grows with each ejection: base × the times the endpoint was ejected', () => {
      const t = setup();

      expectEjectionLasts(t, 'a', BASE);
      expectEjectionLasts(t, 'a', 2 * BASE);
      expectEjectionLasts(t, 'a', 3 * BASE);
      expectEjectionLasts(t, 'b', BASE); // each endpoint its own
    });

    it('is at most 300 s', () => {
      const t = setup({ baseEjectionTime: 100_000 });

      expectEjectionLasts(t, 'a', 100_000);
      expectEjectionLasts(t, 'a', 200_000);
      expectEjectionLasts(t, 'a', 300_000);
      expectEjectionLasts(t, 'a', 300_000);
    });

    it('is at most baseEjectionTime when that is over 300 s', () => {
      const t = setup({ baseEjectionTime: 400_000 });

      expectEjectionLasts(t, 'a', 400_000);
      expectEjectionLasts(t, 'a', 400_000);
    });

    it('comes back down by one base for each interval the endpoint stays in service', () => {
      const t = setup();
      expectEjectionLasts(t, 'a', BASE);
      expectEjectionLasts(t, 'a', 2 * BASE); // a is back now: the sweep that ends an ejection lowers nothing

      t.sweepAt(t.now() + INTERVAL); // one interval in service
      expectEjectionLasts(t, 'a', 2 * BASE);

      t.sweepAt(t.now() + INTERVAL);
      t.sweepAt(t.now() + INTERVAL); // two: back to the start
      expectEjectionLasts(t, 'a', BASE);

      t.sweepAt(t.now() + INTERVAL);
      t.sweepAt(t.now() + INTERVAL);
      t.sweepAt(t.now() + INTERVAL); // never below the start
      expectEjectionLasts(t, 'a', BASE);
    });

    it('comes down only once the endpoint has been back an interval (a timer a few ms early counts)', () => {
      const t = setup();
      expectEjectionLasts(t, 'a', BASE);
      expectEjectionLasts(t, 'a', 2 * BASE);
      const back = t.now();

      for (let at = back + 1_000; at < back + INTERVAL - SWEEP_SLACK_MS; at += 1_000) t.sweepAt(at);
      expectEjectionLasts(t, 'a', 3 * BASE); // not an interval yet: nothing came off

      const back2 = t.now();
      t.sweepAt(back2 + INTERVAL - SWEEP_SLACK_MS);
      expectEjectionLasts(t, 'a', 3 * BASE); // 3 - 1 + 1
    });

    it('stops growing once base × the multiplier reaches 300 s + base, as Envoy, so a few intervals in service barely shorten it', () => {
      const t = setup();
      const lengths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10].map((n) => n * BASE); // 300 s from the 10th
      for (const ms of lengths) expectEjectionLasts(t, 'a', ms); // the multiplier stopped at 11

      for (let i = 1; i <= 3; i++) t.sweepAt(t.now() + INTERVAL); // 11 - 3 = 8
      expectEjectionLasts(t, 'a', 9 * BASE);
    });

    it('ends by the settings in force when the sweep runs', () => {
      const t = setup();
      eject(t, 'a');

      t.sut.configure(settings({ baseEjectionTime: 60_000 }));
      t.sweepAt(BASE);
      expect(t.sut.isEjected('a')).toBe(true);
      t.sweepAt(60_000);
      expect(t.sut.isEjected('a')).toBe(false);
    });
  });

  describe('failure percentage', () => {
    const failurePercentage = { threshold: 50, minimumHosts: 3, requestVolume: 10 };

    it('ejects the endpoints whose failures reach the threshold, not one failure under it', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, failurePercentage });
      calls(t.sut, 'a', 5, 5); // 50 %
      calls(t.sut, 'b', 6, 4); // 40 %
      calls(t.sut, 'c', 10, 0);
      calls(t.sut, 'd', 10, 0);

      expect(t.sweepAt(INTERVAL)).toEqual(['a']);
      expect(t.sut.isEjected('a')).toBe(true);
      expect(t.sut.isEjected('b')).toBe(false);
      expect(t.sut.ejections).toEqual({
        consecutive_failures: 0,
        consecutive_gateway_failures: 0,
        failure_percentage: 1,
        success_rate: 0,
      });
    });

    it('counts gateway failures as failures', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, failurePercentage });
      recordN(t.sut, 'a', 'success', 5);
      recordN(t.sut, 'a', 'gateway_failure', 5);
      for (const key of ['b', 'c']) calls(t.sut, key, 10, 0);

      expect(t.sweepAt(INTERVAL)).toEqual(['a']);
    });

    it('looks only at endpoints with requestVolume calls in the interval', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, failurePercentage });
      for (const key of ['b', 'c', 'd']) calls(t.sut, key, 10, 0);
      calls(t.sut, 'a', 0, 9);
      expect(t.sweepAt(INTERVAL)).toEqual([]);

      for (const key of ['b', 'c', 'd']) calls(t.sut, key, 10, 0);
      calls(t.sut, 'a', 0, 10);
      expect(t.sweepAt(2 * INTERVAL)).toEqual(['a']);
    });

    it('ejects nothing unless minimumHosts endpoints have the volume', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, failurePercentage });
      calls(t.sut, 'a', 0, 10);
      calls(t.sut, 'b', 10, 0);
      calls(t.sut, 'c', 9, 0);
      expect(t.sweepAt(INTERVAL)).toEqual([]);

      calls(t.sut, 'a', 0, 10);
      calls(t.sut, 'b', 10, 0);
      calls(t.sut, 'c', 10, 0);
      expect(t.sweepAt(2 * INTERVAL)).toEqual(['a']);
    });

    it('looks at one interval at a time', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, failurePercentage });
      for (const at of [INTERVAL, 2 * INTERVAL, 3 * INTERVAL]) {
        calls(t.sut, 'a', 0, 5);
        for (const key of ['b', 'c', 'd']) calls(t.sut, key, 10, 0);
        expect(t.sweepAt(at)).toEqual([]);
      }
    });

    it('leaves out endpoints already ejected, which count toward no minimum', () => {
      for (const [endpoints, expected] of [
        [['a', 'b', 'c'], []],
        [['a', 'b', 'c', 'd'], ['b']],
      ] as const) {
        const t = setup({ consecutiveFailures: 5, consecutiveGatewayFailures: 0, failurePercentage }, [...endpoints]);
        calls(t.sut, 'a', 0, 10); // ejected on the 5th failure, the other 5 recorded anyway
        for (let i = 0; i < 3; i++) calls(t.sut, 'b', 1, 4); // 80 % failed, never 5 in a row
        for (const key of endpoints.slice(2)) calls(t.sut, key, 10, 0);

        expect(t.sweepAt(INTERVAL)).toEqual(expected); // with a, b and c: 2 endpoints to look at, minimumHosts 3
        expect(t.sut.ejections.failure_percentage).toBe(expected.length);
      }
    });

    it('is off when the policy has none', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0 });
      calls(t.sut, 'a', 0, 100);
      for (const key of ['b', 'c', 'd']) calls(t.sut, key, 100, 0);

      expect(t.sweepAt(INTERVAL)).toEqual([]);
    });
  });

  describe('success rate', () => {
    const five = ['a', 'b', 'c', 'd', 'e'];
    const successRate = { stdevFactor: 1900, minimumHosts: 5, requestVolume: 10 };

    it("ejects the endpoints under mean − stdev × stdevFactor/1000 (Envoy's example: 50, 100, 100, 100, 100)", () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, successRate }, five);
      calls(t.sut, 'a', 5, 5); // mean 90, stdev 20: under 52
      for (const key of ['b', 'c', 'd', 'e']) calls(t.sut, key, 10, 0);

      expect(t.sweepAt(INTERVAL)).toEqual(['a']);
      expect(t.sut.ejections).toEqual({
        consecutive_failures: 0,
        consecutive_gateway_failures: 0,
        failure_percentage: 0,
        success_rate: 1,
      });
    });

    it('reads stdevFactor in thousandths', () => {
      const t = setup(
        { consecutiveFailures: 0, consecutiveGatewayFailures: 0, successRate: { ...successRate, stdevFactor: 2600 } },
        five,
      );
      calls(t.sut, 'a', 5, 5); // 90 − 20 × 2.6 = 38
      for (const key of ['b', 'c', 'd', 'e']) calls(t.sut, key, 10, 0);

      expect(t.sweepAt(INTERVAL)).toEqual([]);
    });

    it('ejects an endpoint one success under the threshold, not at one more', () => {
      const rates = { b: 10, c: 10, d: 9, e: 9 };
      for (const [successes, expected] of [
        [6, ['a']],
        [7, []],
      ] as const) {
        const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, successRate }, five);
        calls(t.sut, 'a', successes, 10 - successes); // 60 % is under 60.08; 70 % is over 69.19
        for (const [key, ok] of Object.entries(rates)) calls(t.sut, key, ok, 10 - ok);

        expect(t.sweepAt(INTERVAL)).toEqual(expected);
      }
    });

    it('ejects nothing when all are alike', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, successRate }, five);
      for (const key of five) calls(t.sut, key, 7, 3);

      expect(t.sweepAt(INTERVAL)).toEqual([]);
    });

    it('ejects nothing unless minimumHosts endpoints have requestVolume calls', () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0, successRate }, five);
      calls(t.sut, 'a', 0, 10);
      for (const key of ['b', 'c', 'd']) calls(t.sut, key, 10, 0);
      calls(t.sut, 'e', 9, 0);

      expect(t.sweepAt(INTERVAL)).toEqual([]);
    });

    it('caps its ejections by the max ejection percent, the worst first', () => {
      const ten = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'];
      for (const [maxEjectionPercent, expected] of [
        [10, ['c']],
        [100, ['c', 'b']],
      ] as const) {
        const t = setup(
          {
            consecutiveFailures: 0,
            consecutiveGatewayFailures: 0,
            maxEjectionPercent,
            successRate: { stdevFactor: 1000, minimumHosts: 10, requestVolume: 10 },
          },
          ten,
        );
        calls(t.sut, 'b', 2, 8);
        calls(t.sut, 'c', 0, 10); // mean 82, stdev 36.3: both under 45.7
        for (const key of ten.slice(3).concat('a')) calls(t.sut, key, 10, 0);

        expect(t.sweepAt(INTERVAL)).toEqual(expected);
      }
    });

    it('runs before failure percentage, which does not eject the same endpoint again', () => {
      const t = setup(
        {
          consecutiveFailures: 0,
          consecutiveGatewayFailures: 0,
          successRate,
          failurePercentage: { threshold: 40, minimumHosts: 5, requestVolume: 10 },
        },
        five,
      );
      calls(t.sut, 'a', 5, 5);
      for (const key of ['b', 'c', 'd', 'e']) calls(t.sut, key, 10, 0);

      expect(t.sweepAt(INTERVAL)).toEqual(['a']);
      expect(t.sut.ejections.success_rate).toBe(1);
      expect(t.sut.ejections.failure_percentage).toBe(0);
      expect(t.sut.activeEjections).toBe(1);
    });
  });

  describe('sweep', () => {
    it('returns only the endpoints it ejected', () => {
      const t = setup({ failurePercentage: { threshold: 50, minimumHosts: 1, requestVolume: 10 } });
      eject(t, 'a');
      calls(t.sut, 'b', 0, 4);
      calls(t.sut, 'b', 6, 0); // 40 % failed
      calls(t.sut, 'c', 1, 4);
      calls(t.sut, 'c', 1, 4); // 80 % failed, never 5 in a row

      expect(t.sweepAt(INTERVAL)).toEqual(['c']);
    });

    it("starts an endpoint's runs over when it comes back, whatever was recorded while it was out", () => {
      const t = setup();
      expect(
        ['failure', 'failure', 'failure', 'gateway_failure', 'gateway_failure']
          .map((o) => t.sut.record('a', o as CallOutcome))
          .at(-1),
      ).toBe(true);
      recordN(t.sut, 'a', 'gateway_failure', 4); // the caller should not have, but they count: runs of 4 and 6

      t.sweepAt(BASE);
      expect(t.sut.isEjected('a')).toBe(false);
      expect(t.sut.record('a', 'gateway_failure')).toBe(false); // without the reset: runs of 5 and 7
      expect(recordN(t.sut, 'a', 'gateway_failure', 2)).toEqual([false, true]);
    });

    it('works on the real clock by default', () => {
      const sut = new OutlierDetector<string>(settings());
      sut.setEndpoints(['a', 'b']);

      expect(recordN(sut, 'a', 'failure', 5).at(-1)).toBe(true);
      expect(sut.sweep()).toEqual([]);
      expect(sut.isEjected('a')).toBe(true);
    });
  });

  describe('configure', () => {
    it('keeps the ejections in force', () => {
      const t = setup();
      eject(t, 'a');

      t.sut.configure(settings({ consecutiveFailures: 10, maxEjectionPercent: 0 }));
      expect(t.sut.isEjected('a')).toBe(true);
      expect(t.sut.activeEjections).toBe(1);
      t.sweepAt(INTERVAL);
      expect(t.sut.isEjected('a')).toBe(true);
      t.sweepAt(BASE);
      expect(t.sut.isEjected('a')).toBe(false);
    });

    it('applies new thresholds to the runs under way', () => {
      const { sut } = setup();
      recordN(sut, 'a', 'failure', 2);
      recordN(sut, 'b', 'failure', 4);

      sut.configure(settings({ consecutiveFailures: 3 }));
      expect(sut.record('a', 'failure')).toBe(true);

      sut.configure(settings({ consecutiveFailures: 0 }));
      expect(sut.record('b', 'failure')).toBe(false);
    });

    it("applies a rule turned on to the interval's counts at the next sweep", () => {
      const t = setup({ consecutiveFailures: 0, consecutiveGatewayFailures: 0 });
      calls(t.sut, 'a', 0, 10);
      for (const key of ['b', 'c', 'd']) calls(t.sut, key, 10, 0);

      t.sut.configure(
        settings({
          consecutiveFailures: 0,
          consecutiveGatewayFailures: 0,
          failurePercentage: { threshold: 50, minimumHosts: 4, requestVolume: 10 },
        }),
      );
      expect(t.sweepAt(INTERVAL)).toEqual(['a']);
    });
  });

  describe('setEndpoints', () => {
    it('forgets what it knew of the endpoints removed', () => {
      const t = setup();
      eject(t, 'a');
      recordN(t.sut, 'b', 'failure', 4);

      t.sut.setEndpoints(['c', 'd']);
      expect(t.sut.isEjected('a')).toBe(false);
      expect(t.sut.activeEjections).toBe(0);

      t.sut.setEndpoints(['a', 'b', 'c', 'd']);
      expect(t.sut.isEjected('a')).toBe(false);
      expect(t.sut.record('b', 'failure')).toBe(false); // its run starts afresh
      expectEjectionLasts(t, 'a', BASE); // and a's multiplier: not 2 × BASE
    });

    it('keeps what it knows of the endpoints that stay', () => {
      const t = setup();
      eject(t, 'a');
      recordN(t.sut, 'b', 'failure', 4);

      t.sut.setEndpoints(['a', 'b', 'e']);
      expect(t.sut.isEjected('a')).toBe(true);
      expect(t.sut.record('b', 'failure')).toBe(true);
      expect(t.sut.record('e', 'failure')).toBe(false); // new, known from now on
    });

    it('ignores the outcomes of endpoints not in the set', () => {
      const t = setup({ failurePercentage: { threshold: 50, minimumHosts: 1, requestVolume: 1 } });

      expect(recordN(t.sut, 'z', 'failure', 10).some((ejected) => ejected)).toBe(false);
      expect(t.sut.isEjected('z')).toBe(false);
      expect(t.sweepAt(INTERVAL)).toEqual([]);
      expect(t.sut.activeEjections).toBe(0);
    });
  });
});
