import { EnvoyApi } from './envoy-api-check';
import { envoyBootstrap, inboundApiListener } from './envoy-bootstrap';
import { inboundFaultsOf } from './inbound-faults';
import { MeshPolicyError } from './mesh-policy';
import { policyWith } from './policy.testing';

describe(inboundFaultsOf.name, () => {
  const api = EnvoyApi.load();
  const faulty = policyWith([
    ['services', 'batcher', 'inboundFault'],
    { subset: 'next', abort: { grpcStatus: 'UNAVAILABLE', percent: 10 }, delay: { fixed: '1500ms', percent: 2.5 } },
  ]);

  it('reads the abort, the delay and the health-check exemption from the listener the control plane serves', () => {
    const listener = inboundApiListener(faulty, 'batcher', 'next', '127.0.0.1', 7001);
    expect(api.check('envoy.config.listener.v3.Listener', listener)).toEqual([]);
    // Through the wire and back, as a proxyless server gets it.
    const sut = inboundFaultsOf(
      api.decode('envoy.config.listener.v3.Listener', api.encode('envoy.config.listener.v3.Listener', listener)),
    );
    expect(sut).toMatchObject({ abort: { code: 14, percent: 10 }, delay: { ms: 1500, percent: 2.5 } });
    expect(sut!.appliesTo('/infermesh.batcher.v1.BatcherService/Infer')).toBe(true);
    expect(sut!.appliesTo('/grpc.health.v1.Health/Check')).toBe(false);
  });

  it("finds no fault for the instances outside the fault's subset", () => {
    expect(inboundFaultsOf(inboundApiListener(faulty, 'batcher', 'stable', '127.0.0.1', 7001))).toBeUndefined();
    expect(inboundFaultsOf(inboundApiListener(faulty, 'batcher', undefined, '127.0.0.1', 7001))).toBeUndefined();
    expect(inboundFaultsOf(inboundApiListener(faulty, 'router', 'next', '127.0.0.1', 7001))).toBeUndefined();
  });

  it("puts the same fault filter on the inbound listener of the subset's sidecars only", () => {
    const inboundOf = (subset?: string) =>
      JSON.stringify(
        (
          envoyBootstrap(faulty, 'batcher', 'static', subset) as { static_resources: { listeners: { name: string }[] } }
        ).static_resources.listeners.find((l) => l.name === 'inbound'),
      );
    expect(inboundOf('next')).toContain('envoy.filters.http.fault');
    expect(inboundOf('next')).toContain('/grpc.health.v1.Health/');
    expect(inboundOf()).not.toContain('envoy.filters.http.fault');
  });

  it('passes over the RBAC filter before the fault filter (inboundAuthorizationOf reads it)', () => {
    const listener = inboundApiListener(faulty, 'batcher', 'next', '127.0.0.1', 7001);
    expect(JSON.stringify(listener)).toContain('envoy.extensions.filters.http.rbac.v3.RBAC');
    expect(inboundFaultsOf(listener)).toMatchObject({ abort: { code: 14, percent: 10 } });
  });

  it('refuses a listener with a filter a proxyless server cannot run, naming it', () => {
    const listener = inboundApiListener(faulty, 'batcher', 'next', '127.0.0.1', 7001) as {
      filter_chains: { filters: { typed_config: { http_filters: unknown[] } }[] }[];
    };
    listener.filter_chains[0]!.filters[0]!.typed_config.http_filters.unshift({
      name: 'cors',
      typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors' },
    });
    expect(() => inboundFaultsOf(listener)).toThrow(
      'http_filters[0]: type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors is not supported by a proxyless server',
    );
  });

  it('is a policy error to target a subset the service does not have', () => {
    expect(() =>
      policyWith([
        ['services', 'cache', 'inboundFault'],
        { subset: 'next', abort: { grpcStatus: 'UNAVAILABLE', percent: 10 } },
      ]),
    ).toThrow(MeshPolicyError);
    expect(() =>
      policyWith([
        ['services', 'cache', 'inboundFault'],
        { subset: 'next', abort: { grpcStatus: 'UNAVAILABLE', percent: 10 } },
      ]),
    ).toThrow('services.cache.inboundFault.subset: cache has no subset "next" (services.cache.subsets is empty)');
  });
});
