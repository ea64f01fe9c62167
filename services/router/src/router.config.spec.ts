import { ConfigError } from '@infermesh/config';
import { loadRouterConfig } from './router.config';

describe(loadRouterConfig.name, () => {
  it('reports traffic to the registry every second unless ROUTER_TRAFFIC_REPORT_INTERVAL_MS says otherwise', () => {
    expect(loadRouterConfig({}).trafficReportIntervalMs).toBe(1_000);
    expect(loadRouterConfig({ ROUTER_TRAFFIC_REPORT_INTERVAL_MS: '250' }).trafficReportIntervalMs).toBe(250);
  });

  it.each(['0', '-5', '1.5', 'soon'])('refuses ROUTER_TRAFFIC_REPORT_INTERVAL_MS=%s, naming it', (value) => {
    let error: unknown;
    try {
      loadRouterConfig({ ROUTER_TRAFFIC_REPORT_INTERVAL_MS: value });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems.join('\n')).toMatch(
      new RegExp(`^ROUTER_TRAFFIC_REPORT_INTERVAL_MS: .*\\(got "${value}"\\)`),
    );
  });

  it('sends its calls to the batcher each as a call unless ROUTER_BATCHER_CARRIED says true, which the mesh cannot have', () => {
    expect(loadRouterConfig({}).batcherCarried).toBe(false);
    expect(loadRouterConfig({ ROUTER_BATCHER_CARRIED: 'true' }).batcherCarried).toBe(true);
    expect(() => loadRouterConfig({ ROUTER_BATCHER_CARRIED: 'yes' })).toThrow(/ROUTER_BATCHER_CARRIED/);
    let error: unknown;
    try {
      loadRouterConfig({ ROUTER_BATCHER_CARRIED: 'true', ROUTER_BATCHER_ADDRESS: 'xds:///batcher' });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      expect.stringMatching(
        /^ROUTER_BATCHER_CARRIED: true .* but ROUTER_BATCHER_ADDRESS is xds:\/\/\/batcher, the mesh/,
      ),
    ]);
  });
});
