import * as prom from 'prom-client';
import { EVENT_LOOP_DELAY_METRICS, registerEventLoopDelay } from './event-loop-delay';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The figures a scrape of `registry` gives, by name. */
async function scrape(registry: prom.Registry): Promise<Record<string, number>> {
  const metrics = await registry.getMetricsAsJSON();
  return Object.fromEntries(
    metrics.map((m) => [m.name.replace(/^nodejs_eventloop_lag_|_seconds$/g, ''), Number(m.values[0]?.value)]),
  );
}

describe(registerEventLoopDelay.name, () => {
  let registry: prom.Registry;

  beforeEach(() => {
    registry = new prom.Registry();
    registerEventLoopDelay(registry, { service: 'test' });
  });

  it("registers the standard figures' names, with the labels given", async () => {
    await sleep(250);
    const metrics = await registry.getMetricsAsJSON();
    expect(metrics.map((m) => m.name)).toEqual(EVENT_LOOP_DELAY_METRICS);
    expect(metrics.every((m) => m.values[0]?.labels['service'] === 'test')).toBe(true);
  });

  it("reads an idle loop as hardly late, not as the monitor's 100 ms interval", async () => {
    await sleep(450);
    const figures = await scrape(registry);
    // prom-client's own figures, from the same monitor, read 0.1 s or more here.
    expect(figures['p50']).toBeLessThan(0.08);
    expect(figures['min']).toBeLessThan(0.05);
  });

  it('reads a loop blocked for 400 ms as 300 to 400 ms late (the timer was due within its 100 ms), and starts again at each scrape', async () => {
    await sleep(150);
    await scrape(registry);
    // Node's monitor starts again from its next tick after a reset: the interval up to it is not recorded.
    await sleep(150);
    const until = Date.now() + 400;
    while (Date.now() < until) {
      // blocked
    }
    await sleep(250);
    const blocked = await scrape(registry);
    expect(blocked['max']).toBeGreaterThanOrEqual(0.29);
    expect(blocked['max']).toBeLessThan(0.6);
    await sleep(450);
    expect((await scrape(registry))['max']).toBeLessThan(0.29);
  });
});
