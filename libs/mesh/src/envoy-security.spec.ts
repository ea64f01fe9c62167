import { parse } from 'yaml';
import { EnvoyApi } from './envoy-api-check';
import { envoyBootstrap, inboundApiListener } from './envoy-bootstrap';
import { envoySdsFiles } from './envoy-files';
import { IDENTITY_SECRET, sdsFiles, TRUST_BUNDLE_SECRET } from './envoy-security';
import { at, listAt, named } from './json-at.testing';
import { parseMeshPolicy } from './mesh-policy';
import { XDS_TYPES, xdsResources } from './xds-resources';
import { policyWith, SHIPPED_POLICY as SHIPPED } from './policy.testing';

const policy = parseMeshPolicy(SHIPPED);

const TLS = 'typed_config.common_tls_context';
const inboundOf = (bootstrap: unknown) => named(bootstrap, 'static_resources.listeners', 'inbound');
const filterNames = (listener: unknown) =>
  listAt(listener, 'filter_chains[0].filters[0].typed_config.http_filters').map((f) => at(f, 'name'));

describe('mutual TLS and authorization in the Envoy configurations', () => {
  let api: EnvoyApi;

  beforeAll(() => {
    api = EnvoyApi.load();
  });

  it("terminates mutual TLS on the inbound listener: the instance's certificate by SDS, a client certificate of the trust domain required", () => {
    const socket = at(inboundOf(envoyBootstrap(policy, 'router', 'ads')), 'filter_chains[0].transport_socket');

    expect(at(socket, 'typed_config.@type')).toBe(
      'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext',
    );
    expect(at(socket, 'typed_config.require_client_certificate')).toBe(true);
    expect(at(socket, `${TLS}.tls_certificate_sds_secret_configs`)).toEqual([
      {
        name: IDENTITY_SECRET,
        sds_config: {
          path_config_source: { path: '/etc/envoy/sds-identity.yaml', watched_directory: { path: '/etc/envoy' } },
          resource_api_version: 'V3',
        },
      },
    ]);
    expect(
      at(socket, `${TLS}.combined_validation_context.default_validation_context.match_typed_subject_alt_names`),
    ).toEqual([{ san_type: 'URI', matcher: { prefix: 'spiffe://infermesh.local/' } }]);
    expect(at(socket, `${TLS}.combined_validation_context.validation_context_sds_secret_config.name`)).toBe(
      TRUST_BUNDLE_SECRET,
    );
  });

  it("does not require a client certificate of a service that admits anyone (the gateway's public API)", () => {
    expect(
      at(
        inboundOf(envoyBootstrap(policy, 'gateway', 'static')),
        'filter_chains[0].transport_socket.typed_config.require_client_certificate',
      ),
    ).toBe(false);
  });

  it('runs the RBAC filter of the policy before the fault filter, on the sidecar and in the proxyless inbound listener alike', () => {
    const faulty = policyWith([
      ['services', 'router', 'inboundFault'],
      { abort: { grpcStatus: 'UNAVAILABLE', percent: 10 } },
    ]);
    const sidecar = inboundOf(envoyBootstrap(faulty, 'router', 'static'));
    const proxyless = inboundApiListener(faulty, 'router', undefined, '127.0.0.1', 7001);

    expect(filterNames(sidecar)).toEqual([
      'envoy.filters.http.rbac',
      'envoy.filters.http.fault',
      'envoy.filters.http.router',
    ]);
    expect(filterNames(proxyless)).toEqual([
      'envoy.filters.http.rbac',
      'envoy.filters.http.fault',
      'envoy.filters.http.router',
    ]);
    const rbac = at(listAt(sidecar, 'filter_chains[0].filters[0].typed_config.http_filters')[0], 'typed_config');
    expect(rbac).toEqual(
      at(listAt(proxyless, 'filter_chains[0].filters[0].typed_config.http_filters')[0], 'typed_config'),
    );
    expect(rbac).toEqual({
      '@type': 'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC',
      rules: {
        policies: {
          'authorization.router[0]': {
            permissions: [{ url_path: { path: { prefix: '/infermesh.router.v1.RouterService/' } } }],
            principals: [{ authenticated: { principal_name: { exact: 'spiffe://infermesh.local/gateway' } } }],
          },
          health: {
            permissions: [{ url_path: { path: { prefix: '/grpc.health.v1.Health/' } } }],
            principals: [{ any: true }],
          },
        },
      },
    });
    expect(api.check('envoy.config.listener.v3.Listener', proxyless)).toEqual([]);
    expect(api.checkBootstrap(envoyBootstrap(faulty, 'router', 'static'))).toEqual([]);
  });

  it("writes an exact method as an exact path, and the SPIFFE IDs of the policy's trust domain", () => {
    const sut = policyWith([['identity', 'trustDomain'], 'prod.example']);
    const rbac = at(
      listAt(
        inboundOf(envoyBootstrap(sut, 'worker', 'static')),
        'filter_chains[0].filters[0].typed_config.http_filters',
      )[0],
      'typed_config.rules.policies',
    );

    expect((rbac as Record<string, unknown>)['authorization.worker[0]']).toEqual({
      permissions: [
        { url_path: { path: { exact: '/infermesh.worker.v1.WorkerService/Infer' } } },
        { url_path: { path: { exact: '/infermesh.worker.v1.WorkerService/Infers' } } },
        { url_path: { path: { exact: '/infermesh.worker.v1.WorkerService/ListModels' } } },
      ],
      principals: [{ authenticated: { principal_name: { exact: 'spiffe://prod.example/batcher' } } }],
    });
  });

  it.each(['ads', 'static'] as const)(
    "%s: every cluster to a service presents the caller's certificate and accepts only the callee's SPIFFE ID",
    (mode) => {
      const bootstrap = envoyBootstrap(policy, 'router', mode);
      const expected =
        mode === 'ads'
          ? { xds_control_plane: 'registry' }
          : { cache: 'cache', batcher: 'batcher', registry: 'registry' };

      for (const [cluster, callee] of Object.entries(expected)) {
        const socket = at(named(bootstrap, 'static_resources.clusters', cluster), 'transport_socket');
        expect(at(socket, 'typed_config.@type')).toBe(
          'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
        );
        expect(
          at(socket, `${TLS}.combined_validation_context.default_validation_context.match_typed_subject_alt_names`),
        ).toEqual([{ san_type: 'URI', matcher: { exact: `spiffe://infermesh.local/${callee}` } }]);
        expect(at(socket, `${TLS}.tls_certificate_sds_secret_configs[0].name`)).toBe(IDENTITY_SECRET);
      }
      // The local process and Envoy's own admin API stay plaintext, on 127.0.0.1.
      expect(named(bootstrap, 'static_resources.clusters', 'local_app')).not.toHaveProperty('transport_socket');
      expect(named(bootstrap, 'static_resources.clusters', 'envoy_admin')).not.toHaveProperty('transport_socket');
    },
  );

  it('serves sidecars clusters with mutual TLS over ADS, and proxyless clients clusters without (grpc-js-xds refuses SDS)', () => {
    const sidecar = xdsResources(policy, 'gateway', 'envoy', []);
    const proxyless = xdsResources(policy, 'gateway', 'grpc', []);

    expect(at(sidecar[XDS_TYPES.cluster].get('router'), 'transport_socket.name')).toBe('envoy.transport_sockets.tls');
    for (const cluster of proxyless[XDS_TYPES.cluster].values()) expect(cluster).not.toHaveProperty('transport_socket');
    for (const cluster of sidecar[XDS_TYPES.cluster].values())
      expect(api.check('envoy.config.cluster.v3.Cluster', cluster)).toEqual([]);
  });

  it('without mTLS: plaintext, no RBAC filter, no SDS file', () => {
    const plaintext = policyWith([['mtls'], false]);

    for (const mode of ['ads', 'static'] as const) {
      const text = JSON.stringify(envoyBootstrap(plaintext, 'registry', mode));
      expect(text).not.toContain('transport_socket');
      expect(text).not.toContain('rbac');
    }
    expect(sdsFiles(plaintext)).toEqual([]);
  });

  it("reads the certificates from the policy's certificate folder, watching it for rotation, and passes Envoy's check of an SDS file", () => {
    const sut = policyWith(
      [['identity', 'certificateDir'], '/run/identity'],
      [['sidecar', 'configDir'], '/config/envoy'],
    );
    const files = envoySdsFiles(sut);

    expect(files.map((f) => f.fileName)).toEqual(['sds-identity.yaml', 'sds-trust-bundle.yaml']);
    expect(at(files[0]!.response, 'resources[0]')).toEqual({
      '@type': 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret',
      name: IDENTITY_SECRET,
      tls_certificate: {
        certificate_chain: { filename: '/run/identity/cert.pem' },
        private_key: { filename: '/run/identity/key.pem' },
        watched_directory: { path: '/run/identity' },
      },
    });
    expect(at(files[1]!.response, 'resources[0].validation_context')).toEqual({
      trusted_ca: { filename: '/run/identity/ca.pem' },
      watched_directory: { path: '/run/identity' },
    });
    for (const file of files)
      expect(api.check('envoy.service.discovery.v3.DiscoveryResponse', parse(file.text))).toEqual([]);
    expect(JSON.stringify(envoyBootstrap(sut, 'cache', 'ads'))).toContain('"path":"/config/envoy/sds-identity.yaml"');
  });
});
