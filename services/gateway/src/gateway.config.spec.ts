import { ConfigError } from '@infermesh/config';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadGatewayConfig } from './gateway.config';
import { SERVER_VERSION } from './server-status';

describe(loadGatewayConfig.name, () => {
  it('applies the defaults', () => {
    const sut = loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' });
    expect(sut).toMatchObject({
      http: { host: '127.0.0.1', port: 8000 },
      routerAddress: '127.0.0.1:50052',
      registryAddress: '127.0.0.1:50051',
      apiKeys: ['k1'],
      defaultTimeoutMs: 30_000,
      maxBodyBytes: 64 * 1024 * 1024,
      runtime: { grpc: { port: 8001 }, metrics: { port: 8002 } },
    });
  });

  it('splits the keys on commas, trimming blanks', () => {
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: ' a , b,,c ' }).apiKeys).toEqual(['a', 'b', 'c']);
  });

  it.each([
    ['unset', {}],
    ['empty', { GATEWAY_API_KEYS: '' }],
    ['only separators', { GATEWAY_API_KEYS: ' , ,' }],
  ])('refuses to start with the API keys %s, naming the variable', (_label, env) => {
    expect(() => loadGatewayConfig(env)).toThrow(ConfigError);
    expect(() => loadGatewayConfig(env)).toThrow(/GATEWAY_API_KEYS/);
  });

  it('never prints a key in a configuration error', () => {
    try {
      loadGatewayConfig({ GATEWAY_API_KEYS: 'very-secret', GATEWAY_HTTP_PORT: 'x' });
      throw new Error('accepted');
    } catch (error) {
      expect((error as Error).message).toContain('GATEWAY_HTTP_PORT');
      expect((error as Error).message).not.toContain('very-secret');
    }
  });

  it('refuses a bad upstream address, naming the variable', () => {
    expect(() => loadGatewayConfig({ GATEWAY_API_KEYS: 'k', GATEWAY_ROUTER_ADDRESS: 'router' })).toThrow(/GATEWAY_ROUTER_ADDRESS/);
  });

  it('reports the version in package.json', () => {
    const pkg = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8')) as { version: string };
    expect(SERVER_VERSION).toBe(pkg.version);
  });
});
