import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { EnvoyApi } from './envoy-api-check';
import { inboundApiListener } from './envoy-bootstrap';
import { inboundAuthorizationOf } from './inbound-authorization';
import { isCallAuthorized, MESH_SERVICES, type MeshPolicy, type MeshService, parseMeshPolicy } from './mesh-policy';
import { policyWith, SHIPPED_POLICY as SHIPPED } from './policy.testing';

const ROOT = join(__dirname, '..', '..', '..');
const LISTENER = 'envoy.config.listener.v3.Listener';

/** The shipped policy with values set at paths (undefined: the value removed). */

/** Every gRPC method path the repository's protos declare, and the control plane's ADS. */
function protoMethods(): string[] {
  const files: string[] = [];
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) walk(path);
      else if (entry.endsWith('.proto')) files.push(path);
    }
  };
  walk(join(ROOT, 'proto'));
  const methods = files.flatMap((file) => {
    const text = readFileSync(file, 'utf8');
    const pkg = /^package ([\w.]+);/m.exec(text)?.[1];
    const out: string[] = [];
    for (const block of text.split(/^service /m).slice(1)) {
      const service = /^(\w+)/.exec(block)![1]!;
      for (const rpc of block.matchAll(/^\s*rpc (\w+)\s*\(/gm))
        out.push(`/${pkg === undefined ? '' : `${pkg}.`}${service}/${rpc[1]!}`);
    }
    return out;
  });
  return [...methods, '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources'];
}

const id = (service: string) => `spiffe://infermesh.local/${service}`;

describe(inboundAuthorizationOf.name, () => {
  const api = EnvoyApi.load();
  const policy = parseMeshPolicy(SHIPPED);
  /** The service's inbound listener as a proxyless server gets it: checked, then through the wire and back. */
  const served = (service: MeshService, from: MeshPolicy = policy) => {
    const listener = inboundApiListener(from, service, undefined, '127.0.0.1', 7001);
    expect(api.check(LISTENER, listener)).toEqual([]);
    return api.decode(LISTENER, api.encode(LISTENER, listener));
  };

  it('allows what the policy allows, and refuses the rest: every method of every proto, from every service and from no one', () => {
    const methods = protoMethods();
    expect(methods).toEqual(
      expect.arrayContaining([
        '/infermesh.router.v1.RouterService/Infer',
        '/grpc.health.v1.Health/Check',
        '/infermesh.mesh.v1.InstanceService/Announce',
      ]),
    );
    for (const callee of MESH_SERVICES) {
      const sut = inboundAuthorizationOf(served(callee))!;
      for (const path of methods) {
        for (const caller of MESH_SERVICES)
          expect([callee, caller, path, sut.allows(id(caller), path)]).toEqual([
            callee,
            caller,
            path,
            isCallAuthorized(policy, caller, callee, path),
          ]);
        expect([callee, path, sut.allows(undefined, path)]).toEqual([
          callee,
          path,
          isCallAuthorized(policy, undefined, callee, path),
        ]);
        // Another trust domain's router is not the router.
        expect([callee, path, sut.allows('spiffe://elsewhere.example/router', path)]).toEqual([
          callee,
          path,
          isCallAuthorized(policy, undefined, callee, path),
        ]);
      }
    }
  });

  it('lets the gateway call the router, and no one else', () => {
    const sut = inboundAuthorizationOf(served('router'))!;

    expect(sut.allows(id('gateway'), '/infermesh.router.v1.RouterService/Infer')).toBe(true);
    expect(sut.allows(id('batcher'), '/infermesh.router.v1.RouterService/Infer')).toBe(false);
    expect(sut.allows(undefined, '/infermesh.router.v1.RouterService/Infer')).toBe(false);
    expect(sut.allows(id('gateway'), '/infermesh.cache.v1.CacheService/Lookup')).toBe(false);
    expect(sut.describe()).toBe(
      'router is called by gateway (/infermesh.router.v1.RouterService/*); anyone (/grpc.health.v1.Health/*)',
    );
  });

  it('always allows health checks, whoever calls, even of a service nobody may call', () => {
    const closed = policyWith([['authorization', 'cache'], []], [['edges', 1], undefined]); // no router -> cache edge either
    const sut = inboundAuthorizationOf(served('cache', closed))!;

    for (const identity of [undefined, id('router'), 'spiffe://elsewhere.example/x']) {
      expect(sut.allows(identity, '/grpc.health.v1.Health/Check')).toBe(true);
      expect(sut.allows(identity, '/grpc.health.v1.Health/Watch')).toBe(true);
      expect(sut.allows(identity, '/infermesh.cache.v1.CacheService/Lookup')).toBe(false);
    }
    expect(sut.describe()).toBe('cache is called by anyone (/grpc.health.v1.Health/*)');
  });

  it("keeps the registry's admin RPCs to the gateway, and gives the others what they read", () => {
    const sut = inboundAuthorizationOf(served('registry'))!;
    const registry = (method: string) => `/infermesh.registry.v1.RegistryService/${method}`;

    expect(sut.allows(id('gateway'), registry('CreateModelVersion'))).toBe(true);
    for (const caller of ['router', 'batcher', 'worker', 'cache'])
      expect([caller, sut.allows(id(caller), registry('CreateModelVersion'))]).toEqual([caller, false]);
    expect(sut.allows(id('router'), registry('ResolveModelVersion'))).toBe(true);
    expect(sut.allows(id('router'), registry('DeleteModel'))).toBe(false);
    expect(sut.allows(id('worker'), registry('DownloadArtifact'))).toBe(true);
    expect(sut.allows(id('worker'), registry('ReportVersionState'))).toBe(true);
    expect(sut.allows(id('batcher'), registry('ReportVersionState'))).toBe(false);
    // The routers report their traffic; nobody else may.
    expect(sut.allows(id('router'), registry('ReportTraffic'))).toBe(true);
    expect(sut.allows(id('worker'), registry('ReportTraffic'))).toBe(false);
    for (const caller of MESH_SERVICES) {
      expect(sut.allows(id(caller), '/infermesh.mesh.v1.InstanceService/Announce')).toBe(true);
      expect(
        sut.allows(id(caller), '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources'),
      ).toBe(true);
    }
    expect(sut.allows(undefined, '/infermesh.mesh.v1.InstanceService/Announce')).toBe(false);
    expect(sut.describe()).toContain(
      'router (/infermesh.registry.v1.RegistryService/{GetModel,ResolveModelVersion,WatchModels,ReportTraffic})',
    );
  });

  it("opens the gateway's public API to callers without a certificate", () => {
    const sut = inboundAuthorizationOf(served('gateway'))!;

    expect(sut.allows(undefined, '/inference.GRPCInferenceService/ModelInfer')).toBe(true);
    expect(sut.allows(id('router'), '/infermesh.gateway.v1.ApiKeyService/CreateApiKey')).toBe(true);
    expect(sut.allows(undefined, '/infermesh.worker.v1.WorkerService/Infer')).toBe(false);
  });

  it('finds no authorization without mTLS, nor in a listener without an RBAC filter', () => {
    const plaintext = policyWith([['mtls'], false]);
    expect(JSON.stringify(served('router', plaintext))).not.toContain('rbac');
    expect(inboundAuthorizationOf(served('router', plaintext))).toBeUndefined();
  });

  describe('refuses what it cannot enforce exactly, naming it (so the update is NACKed)', () => {
    type Listener = {
      filter_chains: { filters: { typed_config: { http_filters: { typed_config: Record<string, unknown> }[] } }[] }[];
    };
    const rbacOf = (listener: Listener) =>
      listener.filter_chains[0]!.filters[0]!.typed_config.http_filters[0]!.typed_config;
    const routerRules = () => {
      const listener = served('router') as Listener;
      return {
        listener,
        rbac: rbacOf(listener),
        policies: (rbacOf(listener)['rules'] as { policies: Record<string, Record<string, unknown[]>> }).policies,
      };
    };
    const at = 'inbound listener: http_filters[0].typed_config';

    it.each<[string, (r: ReturnType<typeof routerRules>) => void, string]>([
      [
        'a DENY action',
        (r) => ((r.rbac['rules'] as Record<string, unknown>)['action'] = 'DENY'),
        `${at}.rules.action: only ALLOW is supported by a proxyless server, got "DENY"`,
      ],
      ['shadow rules', (r) => (r.rbac['shadow_rules'] = {}), `${at}.shadow_rules: not supported by a proxyless server`],
      ['a filter without rules', (r) => delete r.rbac['rules'], `${at}.rules: required`],
      [
        'a condition',
        (r) => (r.policies['authorization.router[0]']!['condition'] = {} as unknown as unknown[]),
        `${at}.rules.policies.authorization.router[0].condition: not supported`,
      ],
      [
        'a header principal',
        (r) => (r.policies['authorization.router[0]']!['principals'] = [{ header: { name: 'x-caller' } }]),
        `${at}.rules.policies.authorization.router[0].principals[0].header: not supported by a proxyless server`,
      ],
      [
        'a principal by prefix',
        (r) =>
          (r.policies['authorization.router[0]']!['principals'] = [
            { authenticated: { principal_name: { prefix: 'spiffe://' } } },
          ]),
        `${at}.rules.policies.authorization.router[0].principals[0].authenticated.principal_name: only exact is supported`,
      ],
      [
        'a path matched ignoring case',
        (r) =>
          (r.policies['authorization.router[0]']!['permissions'] = [
            { url_path: { path: { exact: '/a.B/C', ignore_case: true } } },
          ]),
        `${at}.rules.policies.authorization.router[0].permissions[0].url_path.path.ignore_case: not supported`,
      ],
      [
        'a permission by destination port',
        (r) => (r.policies['authorization.router[0]']!['permissions'] = [{ destination_port: 50052 }]),
        `${at}.rules.policies.authorization.router[0].permissions[0].destination_port: not supported`,
      ],
      [
        'a policy without principals',
        (r) => delete r.policies['authorization.router[0]']!['principals'],
        `${at}.rules.policies.authorization.router[0].principals: expected at least one`,
      ],
    ])('%s', (_what, change, message) => {
      const rules = routerRules();
      change(rules);
      expect(() => inboundAuthorizationOf(rules.listener)).toThrow(message);
    });

    it('a second RBAC filter', () => {
      const { listener } = routerRules();
      const filters = listener.filter_chains[0]!.filters[0]!.typed_config.http_filters;
      filters.splice(1, 0, filters[0]!);
      expect(() => inboundAuthorizationOf(listener)).toThrow(
        'inbound listener: http_filters[1]: a second RBAC filter is not supported by a proxyless server',
      );
    });
  });

  it('reads the set forms too: or_rules of paths and or_ids of SPIFFE IDs', () => {
    const listener = {
      filter_chains: [
        {
          filters: [
            {
              typed_config: {
                '@type':
                  'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
                route_config: { virtual_hosts: [{ name: 'cache' }] },
                http_filters: [
                  {
                    typed_config: {
                      '@type': 'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC',
                      rules: {
                        action: 'ALLOW',
                        policies: {
                          callers: {
                            permissions: [
                              {
                                or_rules: {
                                  rules: [
                                    { url_path: { path: { exact: '/a.B/C' } } },
                                    { url_path: { path: { prefix: '/a.D/' } } },
                                  ],
                                },
                              },
                            ],
                            principals: [
                              {
                                or_ids: {
                                  ids: [
                                    { authenticated: { principal_name: { exact: id('router') } } },
                                    { authenticated: { principal_name: { exact: id('gateway') } } },
                                  ],
                                },
                              },
                            ],
                          },
                        },
                      },
                    },
                  },
                ],
              },
            },
          ],
        },
      ],
    };

    const sut = inboundAuthorizationOf(listener)!;

    expect(sut.allows(id('gateway'), '/a.D/E')).toBe(true);
    expect(sut.allows(id('router'), '/a.B/C')).toBe(true);
    expect(sut.allows(id('router'), '/a.B/X')).toBe(false);
    expect(sut.allows(id('batcher'), '/a.B/C')).toBe(false);
    expect(sut.describe()).toBe('cache is called by router, gateway (/a.D/*, /a.B/C)');
  });
});
