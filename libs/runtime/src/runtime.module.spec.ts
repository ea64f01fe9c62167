import { configureTransportSecurity, transportSecurity } from '@infermesh/grpc';
import { parseEnv } from '@infermesh/config';
import { RuntimeModule } from './runtime.module';
import { runtimeSettings, runtimeShape } from './runtime-config';

const load = (env: Record<string, string>) =>
  runtimeSettings('SVC', parseEnv(runtimeShape('SVC', { grpc: 50055, metrics: 9105 }), env));
const IN_MESH = { INFERMESH_MESH_CONTROL_PLANE: '127.0.0.1:50051', INFERMESH_TLS_DIR: '/var/run/infermesh/identity' };

describe('RuntimeModule.forRoot', () => {
  afterEach(() => configureTransportSecurity(undefined));

  it("makes the whole process speak mutual TLS with the instance's identity", () => {
    const settings = load(IN_MESH);

    RuntimeModule.forRoot('worker', settings);

    expect(transportSecurity()).toEqual(settings.tls);
  });

  it('leaves the process in plaintext behind a sidecar, the identity kept in the settings', () => {
    const settings = load({ ...IN_MESH, INFERMESH_SIDECAR_PORT: '15006' });

    RuntimeModule.forRoot('worker', settings);

    expect(transportSecurity()).toBeUndefined();
    expect(settings.tls?.caFile).toBe('/var/run/infermesh/identity/ca.pem');
  });
});
