import { ConfigError, type Env, parseEnv } from '@infermesh/config';
import {
  ownInboundFilters,
  processTransportSecurity,
  type RuntimeSettings,
  runtimeSettings,
  runtimeShape,
} from './runtime-config';
import { thrownBy } from '@infermesh/testing';

const shape = runtimeShape('SVC', { grpc: 50055, metrics: 9105 });
const load = (env: Env): RuntimeSettings => runtimeSettings('SVC', parseEnv(shape, env));

const configError = (fn: () => unknown): ConfigError => thrownBy(fn, ConfigError);

const MESH = { INFERMESH_MESH_CONTROL_PLANE: '127.0.0.1:50051', INFERMESH_INSTANCE_ADDRESS: '10.0.0.7' };
const IDENTITY = { INFERMESH_TLS_DIR: '/var/run/infermesh/identity' };
const SIDECAR = { INFERMESH_SIDECAR_PORT: '15006' };

describe('INFERMESH_SIDECAR_PORT', () => {
  it('is unset by default: no sidecar', () => {
    expect(load(MESH).mesh?.sidecarPort).toBeUndefined();
  });

  it('is read in the mesh, with the identity still carried', () => {
    const settings = load({ ...MESH, ...IDENTITY, ...SIDECAR });

    expect(settings.mesh?.sidecarPort).toBe(15006);
    expect(settings.tls?.certFile).toBe('/var/run/infermesh/identity/cert.pem');
    expect(settings.grpc.port).toBe(50055);
  });

  it('is refused without the control plane, saying where the sidecar takes its configuration from', () => {
    const error = configError(() => load(SIDECAR));

    expect(error.problems).toEqual([
      'INFERMESH_SIDECAR_PORT: the sidecar takes its configuration from the mesh control plane the service announces itself to: set INFERMESH_MESH_CONTROL_PLANE too',
    ]);
  });

  it("is refused when it is the service's own gRPC port, set or by default", () => {
    expect(configError(() => load({ ...MESH, SVC_GRPC_PORT: '15006', ...SIDECAR })).problems).toEqual([
      'INFERMESH_SIDECAR_PORT: 15006 is also SVC_GRPC_PORT: the sidecar and the service it forwards to cannot both listen on one port',
    ]);
    expect(configError(() => load({ ...MESH, INFERMESH_SIDECAR_PORT: '50055' })).problems).toEqual([
      'INFERMESH_SIDECAR_PORT: 50055 is also SVC_GRPC_PORT: the sidecar and the service it forwards to cannot both listen on one port',
    ]);
  });

  it('names every problem at once, the identity without the mesh included', () => {
    const problems = configError(() => load({ ...IDENTITY, ...SIDECAR })).problems;

    expect(problems).toHaveLength(2);
    expect(problems[0]).toMatch(/^INFERMESH_TLS_DIR: /);
    expect(problems[1]).toMatch(/^INFERMESH_SIDECAR_PORT: .*set INFERMESH_MESH_CONTROL_PLANE too$/);
  });

  it.each(['0', '65536', 'envoy', '15006.5'])('refuses %p as a port, naming the variable', (value) => {
    const problems = configError(() => load({ ...MESH, INFERMESH_SIDECAR_PORT: value })).problems;

    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/^INFERMESH_SIDECAR_PORT: /);
    expect(problems[0]).toContain(`(got "${value}")`);
  });
});

describe(processTransportSecurity.name, () => {
  it("is the instance's identity without a sidecar", () => {
    const settings = load({ ...MESH, ...IDENTITY });

    expect(processTransportSecurity(settings)).toBe(settings.tls);
    expect(settings.tls).toBeDefined();
  });

  it('is plaintext behind a sidecar, which speaks mutual TLS for the service', () => {
    expect(processTransportSecurity(load({ ...MESH, ...IDENTITY, ...SIDECAR }))).toBeUndefined();
  });

  it('is plaintext without an identity', () => {
    expect(processTransportSecurity(load(MESH))).toBeUndefined();
  });
});

describe(ownInboundFilters.name, () => {
  it('does nothing outside the mesh', () => {
    expect(ownInboundFilters(load({}), false)).toEqual({ faultInjection: false, authorization: false });
  });

  it('injects faults in the mesh, and authorizes with mutual TLS but not on a public port', () => {
    expect(ownInboundFilters(load(MESH), false)).toEqual({ faultInjection: true, authorization: false });
    expect(ownInboundFilters(load({ ...MESH, ...IDENTITY }), false)).toEqual({
      faultInjection: true,
      authorization: true,
    });
    expect(ownInboundFilters(load({ ...MESH, ...IDENTITY }), true)).toEqual({
      faultInjection: true,
      authorization: false,
    });
  });

  it('does neither behind a sidecar, whose inbound listener does both', () => {
    expect(ownInboundFilters(load({ ...MESH, ...SIDECAR }), false)).toEqual({
      faultInjection: false,
      authorization: false,
    });
    expect(ownInboundFilters(load({ ...MESH, ...IDENTITY, ...SIDECAR }), false)).toEqual({
      faultInjection: false,
      authorization: false,
    });
  });
});
