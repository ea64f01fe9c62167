import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { EnvoyApi } from './envoy-api-check';
import { edgeRouteConfiguration, envoyBootstrap, sidecarEdges } from './envoy-bootstrap';
import { envoyConfigFiles, envoySdsFiles } from './envoy-files';
import { at, listAt, named } from './json-at.testing';
import { parseMeshPolicy } from './mesh-policy';
import { policyWith, SHIPPED_POLICY as SHIPPED } from './policy.testing';

const ROOT = join(__dirname, '..', '..', '..');
const ENVOY = join(ROOT, 'envoy');
const policy = parseMeshPolicy(SHIPPED);

/**
 * The checked-in golden of a generated file: the static files under envoy/generated/static; the ADS
 * ones (what the Kubernetes sidecars run) in the mesh ConfigMap, k8s/components/envoy-sidecar/generated.
 */
function golden(mode: 'ads' | 'static', fileName: string): string {
  if (mode === 'static') return readFileSync(join(ENVOY, 'generated', 'static', fileName), 'utf8');
  const configMap = parse(
    readFileSync(join(ROOT, 'k8s', 'components', 'envoy-sidecar', 'generated', 'mesh-config.yaml'), 'utf8'),
  ) as { data: Record<string, string> };
  return configMap.data[fileName] ?? `(no ${fileName} in the mesh ConfigMap)`;
}

/** The shipped policy with values set at paths. */

/** The route action of the last (catch-all) route of an edge's route configuration. */
const defaultRoute = (config: unknown) => at(listAt(config, 'virtual_hosts[0].routes').at(-1), 'route');
const names = (list: unknown[]) => list.map((item) => at(item, 'name'));

describe('envoyBootstrap', () => {
  let api: EnvoyApi;

  beforeAll(() => {
    api = EnvoyApi.load();
  });

  describe.each(['ads', 'static'] as const)('%s mode', (mode) => {
    const files = envoyConfigFiles(policy, mode);

    it.each(files.map((f) => [f.fileName, f] as const))(
      `%s is the checked-in golden (regenerate: ${mode === 'ads' ? 'npx infermesh k8s generate' : 'npx infermesh mesh envoy --mode static --out envoy/generated/static'})`,
      (_name, file) => {
        expect(file.text).toBe(golden(mode, file.fileName));
      },
    );

    it.each(files.map((f) => [f.fileName, f] as const))(
      "%s passes the check against Envoy's v3 API with no problem",
      (_name, file) => {
        expect(api.checkBootstrap(parse(file.text))).toEqual([]);
      },
    );

    it.each(envoySdsFiles(policy).map((f) => [f.fileName, f] as const))(
      '%s (file-based SDS) is the checked-in golden and passes the check as a DiscoveryResponse',
      (_name, file) => {
        expect(file.text).toBe(golden(mode, file.fileName));
        expect(api.check('envoy.service.discovery.v3.DiscoveryResponse', parse(file.text))).toEqual([]);
      },
    );
  });

  it('ads: the sidecar reaches the control plane over ADS and takes its listeners and clusters from it', () => {
    const sut = envoyBootstrap(policy, 'router', 'ads');

    expect(at(sut, 'dynamic_resources.ads_config.grpc_services')).toEqual([
      { envoy_grpc: { cluster_name: 'xds_control_plane' } },
    ]);
    expect(names(listAt(sut, 'static_resources.listeners'))).toEqual(['inbound', 'stats']);
    expect(names(listAt(sut, 'static_resources.clusters'))).toEqual(['local_app', 'envoy_admin', 'xds_control_plane']);
    expect(
      at(
        sut,
        'static_resources.clusters[0].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value',
      ),
    ).toBe(50052);
    expect(at(sut, 'admin.address.socket_address.address')).toBe('127.0.0.1');
  });

  it("static: an outbound listener on each upstream's port, but none for the workers the batcher chooses itself", () => {
    expect(sidecarEdges(policy, 'batcher').map((e) => e.to)).toEqual(['registry']);
    const sut = envoyBootstrap(policy, 'router', 'static');

    expect(
      listAt(sut, 'static_resources.listeners').map((l) => [
        at(l, 'name'),
        at(l, 'address.socket_address.address'),
        at(l, 'address.socket_address.port_value'),
      ]),
    ).toEqual([
      ['inbound', '0.0.0.0', 15006],
      ['stats', '0.0.0.0', 15090],
      ['outbound_cache', '127.0.0.1', 50053],
      ['outbound_batcher', '127.0.0.1', 50054],
      ['outbound_registry', '127.0.0.1', 50051],
    ]);
    const batcher = named(sut, 'static_resources.clusters', 'batcher');
    expect(at(batcher, 'type')).toBe('STRICT_DNS');
    expect(at(batcher, 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address')).toEqual({
      address: 'batcher.infermesh.svc.cluster.local',
      port_value: 15006,
    });
    expect(at(batcher, 'load_balancing_policy.policies[0].typed_extension_config.name')).toBe(
      'envoy.load_balancing_policies.least_request',
    );
    expect(at(batcher, 'outlier_detection')).toMatchObject({
      consecutive_5xx: 5,
      enforcing_consecutive_5xx: 100,
      consecutive_gateway_failure: 3,
      base_ejection_time: '15s',
      max_ejection_percent: 50,
      failure_percentage_threshold: 50,
    });
    expect(at(batcher, 'circuit_breakers.thresholds[0]')).toMatchObject({
      max_requests: 4096,
      max_retries: 64,
      retry_budget: { budget_percent: { value: 20 }, min_retry_concurrency: 3 },
    });
    expect(at(batcher, 'health_checks')).toEqual([expect.objectContaining({ grpc_health_check: {} })]);
  });

  it('compiles a split into weighted clusters, header matches first, retries, mirroring and ring hashing', () => {
    const sut = policyWith(
      [
        ['edges', 0, 'split'],
        [
          { subset: 'stable', weight: 90 },
          { subset: 'next', weight: 10 },
        ],
      ],
      [['edges', 0, 'mirror'], { subset: 'next', percent: 5 }],
      [['edges', 0, 'loadBalancing'], { policy: 'ring_hash', hashHeader: 'x-routing-key' }],
    );

    const config = edgeRouteConfiguration(sut.edges[0]!);

    expect(at(config, 'virtual_hosts[0].routes[0]')).toMatchObject({
      match: { prefix: '/', headers: [{ name: 'x-infermesh-router', string_match: { exact: 'next' } }] },
      route: { cluster: 'router.next' },
    });
    const route = defaultRoute(config);
    expect(at(route, 'weighted_clusters')).toEqual({
      clusters: [
        { name: 'router.stable', weight: 90 },
        { name: 'router.next', weight: 10 },
      ],
    });
    expect(at(route, 'retry_policy')).toMatchObject({
      retry_on: 'unavailable',
      num_retries: 2,
      retry_back_off: { base_interval: '0.025s', max_interval: '0.25s' },
    });
    expect(at(route, 'hash_policy')).toEqual([{ header: { header_name: 'x-routing-key' } }]);
    expect(at(route, 'request_mirror_policies')).toEqual([
      { cluster: 'router.next', runtime_fraction: { default_value: { numerator: 50_000, denominator: 'MILLION' } } },
    ]);
    expect(defaultRoute(edgeRouteConfiguration(policy.edges[1]!))).not.toHaveProperty('retry_policy'); // router -> cache: 1 attempt
  });

  it('injects faults the policy asks for, as gRPC statuses', () => {
    const sut = policyWith([
      ['edges', 2, 'fault'],
      { abort: { percent: 10, grpcStatus: 'UNAVAILABLE' }, delay: { percent: 1, fixed: '100ms' } },
    ]);

    const bootstrap = envoyBootstrap(sut, 'router', 'static');
    const listener = named(bootstrap, 'static_resources.listeners', 'outbound_batcher');
    const filters = listAt(listener, 'filter_chains[0].filters[0].typed_config.http_filters');

    expect(names(filters)).toEqual(['envoy.filters.http.fault', 'envoy.filters.http.router']);
    expect(at(filters[0], 'typed_config')).toMatchObject({
      abort: { grpc_status: 14, percentage: { numerator: 100_000, denominator: 'MILLION' } },
      delay: { fixed_delay: '0.1s' },
    });
    expect(api.checkBootstrap(bootstrap)).toEqual([]);
  });

  it('sends traces to the collector the policy names', () => {
    const sut = policyWith([['tracing'], { collector: 'otel-collector.observability:4317' }]);

    const bootstrap = envoyBootstrap(sut, 'gateway', 'static');

    expect(at(named(bootstrap, 'static_resources.clusters', 'otel_collector'), 'type')).toBe('STRICT_DNS');
    expect(
      at(bootstrap, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.tracing.provider.name'),
    ).toBe('envoy.tracers.opentelemetry');
    expect(api.checkBootstrap(bootstrap)).toEqual([]);
  });
});
