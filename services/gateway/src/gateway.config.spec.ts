import { ConfigError } from '@infermesh/config';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { loadGatewayConfig } from './gateway.config';
import { SERVER_VERSION } from './server-status';

describe(loadGatewayConfig.name, () => {
  it('applies the defaults', () => {
    const sut = loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' });
    expect(sut).toMatchObject({
      http: { host: '127.0.0.1', port: 8000, sendTimeoutMs: 30_000 },
      routerAddress: '127.0.0.1:50052',
      registryAddress: '127.0.0.1:50051',
      apiKeys: [{ key: 'k1', scopes: [Scope.INFER, Scope.ADMIN] }],
      defaultTimeoutMs: 30_000,
      maxBodyBytes: 64 * 1024 * 1024,
      runtime: { grpc: { port: 8001 }, metrics: { port: 8002 } },
    });
  });

  it('splits the keys on commas, trimming blanks; a key alone has every scope', () => {
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: ' a , b,,c ' }).apiKeys.map((k) => k.key)).toEqual(['a', 'b', 'c']);
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: 'a' }).apiKeys[0]!.scopes).toEqual([Scope.INFER, Scope.ADMIN]);
  });

  it('reads the scopes of KEY:SCOPE[+SCOPE] entries', () => {
    expect(
      loadGatewayConfig({ GATEWAY_API_KEYS: 'reader:infer, ops:admin ,both:admin+infer,all, spaced: infer + admin' })
        .apiKeys,
    ).toEqual([
      { key: 'reader', scopes: [Scope.INFER] },
      { key: 'ops', scopes: [Scope.ADMIN] },
      { key: 'both', scopes: [Scope.INFER, Scope.ADMIN] },
      { key: 'all', scopes: [Scope.INFER, Scope.ADMIN] },
      { key: 'spaced', scopes: [Scope.INFER, Scope.ADMIN] },
    ]);
  });

  it.each([
    ['an unknown scope', 'ok-key, secret-one:write', /entry 2 names an unknown or empty scope/],
    ['an empty scope', 'secret-one:', /entry 1 names an unknown or empty scope/],
    ['a dangling +', 'a,,secret-one:infer+', /entry 3 names an unknown or empty scope/],
    ['scopes without a key', 'a, :admin', /entry 2 has no key/],
    ['a key given twice', 'secret-one:infer,b,secret-one:admin', /entry 3 repeats the key of entry 1/],
  ])('refuses %s, naming the entry by its position and never printing it', (_label, keys, message) => {
    let error: unknown;
    try {
      loadGatewayConfig({ GATEWAY_API_KEYS: keys });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as Error).message).toMatch(message);
    expect((error as Error).message).toContain('GATEWAY_API_KEYS');
    expect((error as Error).message).not.toContain('secret-one');
    expect((error as Error).message).not.toMatch(/write/);
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
    expect(() => loadGatewayConfig({ GATEWAY_API_KEYS: 'k', GATEWAY_ROUTER_ADDRESS: 'router' })).toThrow(
      /GATEWAY_ROUTER_ADDRESS/,
    );
  });

  it('keeps stored keys in a file under GATEWAY_DATA_DIR and limits nothing by default', () => {
    const sut = loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' });
    expect(sut).toMatchObject({
      redisUrl: undefined,
      redisKeyPrefix: 'infermesh:',
      dataDir: resolve('.infermesh/gateway'),
      apiKeysFile: resolve('.infermesh/gateway/api-keys.json'),
      apiKeyCacheMs: 1_000,
      defaultRateLimit: { requestsPerSecond: 0, burst: 0, perModelRequestsPerSecond: 0, perModelBurst: 0 },
      rateLimitRedisDown: 'local',
    });
  });

  it('reads Redis, the data folder, the key cache time, the default rate limits and the Redis-down policy', () => {
    const sut = loadGatewayConfig({
      GATEWAY_API_KEYS: 'k1',
      REDIS_URL: 'redis://cache:6379/2',
      GATEWAY_DATA_DIR: '/var/lib/infermesh/gateway',
      GATEWAY_API_KEY_CACHE_MS: '250',
      GATEWAY_RATE_LIMIT_RPS: '12.5',
      GATEWAY_RATE_LIMIT_BURST: '20',
      GATEWAY_RATE_LIMIT_PER_MODEL_RPS: '0.5',
      GATEWAY_RATE_LIMIT_PER_MODEL_BURST: '2',
      GATEWAY_RATE_LIMIT_REDIS_DOWN: 'closed',
    });
    expect(sut).toMatchObject({
      redisUrl: 'redis://cache:6379/2',
      apiKeysFile: '/var/lib/infermesh/gateway/api-keys.json',
      apiKeyCacheMs: 250,
      defaultRateLimit: { requestsPerSecond: 12.5, burst: 20, perModelRequestsPerSecond: 0.5, perModelBurst: 2 },
      rateLimitRedisDown: 'closed',
    });
  });

  it.each([
    ['a URL that is not Redis', { REDIS_URL: 'http://cache:6379' }, /REDIS_URL/],
    ['a negative rate', { GATEWAY_RATE_LIMIT_RPS: '-1' }, /GATEWAY_RATE_LIMIT_RPS/],
    ['a rate that is not a number', { GATEWAY_RATE_LIMIT_PER_MODEL_RPS: 'fast' }, /GATEWAY_RATE_LIMIT_PER_MODEL_RPS/],
    [
      'a fractional burst',
      { GATEWAY_RATE_LIMIT_RPS: '1', GATEWAY_RATE_LIMIT_BURST: '1.5' },
      /GATEWAY_RATE_LIMIT_BURST/,
    ],
    [
      'a burst without a rate',
      { GATEWAY_RATE_LIMIT_BURST: '5' },
      /GATEWAY_RATE_LIMIT_BURST: set GATEWAY_RATE_LIMIT_RPS too/,
    ],
    [
      'a model burst without a rate',
      { GATEWAY_RATE_LIMIT_PER_MODEL_BURST: '5' },
      /GATEWAY_RATE_LIMIT_PER_MODEL_BURST: set GATEWAY_RATE_LIMIT_PER_MODEL_RPS too/,
    ],
    ['an unknown Redis-down policy', { GATEWAY_RATE_LIMIT_REDIS_DOWN: 'ignore' }, /GATEWAY_RATE_LIMIT_REDIS_DOWN/],
  ])('refuses %s, naming the variable', (_label, env, message) => {
    expect(() => loadGatewayConfig({ GATEWAY_API_KEYS: 'k1', ...env })).toThrow(message);
  });

  it('limits inputs, elements per tensor and batch size generously by default, and reads each limit', () => {
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' }).tensorLimits).toEqual({
      maxInputs: 64,
      maxTensorElements: 16_777_216,
      maxBatchSize: 4_096,
      maxNameBytes: 1_024,
    });
    const sut = loadGatewayConfig({
      GATEWAY_API_KEYS: 'k1',
      GATEWAY_MAX_INPUTS: '3',
      GATEWAY_MAX_TENSOR_ELEMENTS: '1000',
      GATEWAY_MAX_BATCH_SIZE: '16',
      GATEWAY_MAX_NAME_BYTES: '80',
    });
    expect(sut.tensorLimits).toEqual({ maxInputs: 3, maxTensorElements: 1000, maxBatchSize: 16, maxNameBytes: 80 });
  });

  it.each([
    ['GATEWAY_MAX_INPUTS', '0'],
    ['GATEWAY_MAX_TENSOR_ELEMENTS', '-5'],
    ['GATEWAY_MAX_BATCH_SIZE', '2.5'],
    ['GATEWAY_MAX_BATCH_SIZE', 'many'],
  ])('refuses %s=%s, naming the variable', (name, value) => {
    expect(() => loadGatewayConfig({ GATEWAY_API_KEYS: 'k1', [name]: value })).toThrow(new RegExp(name));
  });

  it('refuses a configured key in the format of stored keys, never printing it', () => {
    const stored = `im_0123456789ab_${'s'.repeat(43)}`;
    let error: unknown;
    try {
      loadGatewayConfig({ GATEWAY_API_KEYS: `ok-key, ${stored}:infer` });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as Error).message).toMatch(/GATEWAY_API_KEYS: entry 2 has the format of a stored key/);
    expect((error as Error).message).not.toContain('sss');
  });

  it('reports the version in package.json', () => {
    const pkg = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8')) as {
      version: string;
    };
    expect(SERVER_VERSION).toBe(pkg.version);
  });

  it('bounds deadlines, names and the bodies in flight by default, and reads each setting', () => {
    const defaults = loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' });
    expect([defaults.maxTimeoutMs, defaults.maxBodyBytesInFlight, defaults.tensorLimits.maxNameBytes]).toEqual([
      600_000,
      256 * 2 ** 20,
      1_024,
    ]);
    const sut = loadGatewayConfig({
      GATEWAY_API_KEYS: 'k1',
      GATEWAY_MAX_REQUEST_TIMEOUT_MS: '60000',
      GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: '1GiB',
      GATEWAY_MAX_NAME_BYTES: '64',
    });
    expect([sut.maxTimeoutMs, sut.maxBodyBytesInFlight, sut.tensorLimits.maxNameBytes]).toEqual([60_000, 2 ** 30, 64]);
  });

  it('limits inference in flight adaptively between 16 and 1024 by default; the floor never above the ceiling; fixed on request', () => {
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: 'k1' }).concurrency).toEqual({ adaptive: true, min: 16, max: 1_024 });
    expect(loadGatewayConfig({ GATEWAY_API_KEYS: 'k1', GATEWAY_MAX_IN_FLIGHT: '8' }).concurrency).toEqual({
      adaptive: true,
      min: 8,
      max: 8,
    });
    expect(
      loadGatewayConfig({ GATEWAY_API_KEYS: 'k1', GATEWAY_CONCURRENCY_LIMIT: 'fixed', GATEWAY_MIN_IN_FLIGHT: '4' })
        .concurrency,
    ).toEqual({ adaptive: false, min: 4, max: 1_024 });
  });

  it.each([
    [{ GATEWAY_CONCURRENCY_LIMIT: 'gradient' }, /GATEWAY_CONCURRENCY_LIMIT/],
    [{ GATEWAY_MIN_IN_FLIGHT: '0' }, /GATEWAY_MIN_IN_FLIGHT/],
    [{ GATEWAY_MAX_REQUEST_TIMEOUT_MS: '3000000000' }, /GATEWAY_MAX_REQUEST_TIMEOUT_MS: at most 2073600000/],
    [
      { GATEWAY_MAX_REQUEST_TIMEOUT_MS: '10000' },
      /GATEWAY_REQUEST_TIMEOUT_MS: the default deadline \(30000\) is longer than GATEWAY_MAX_REQUEST_TIMEOUT_MS/,
    ],
    [
      { GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: '1MiB' },
      /GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: 1048576 bytes cannot hold one body of GATEWAY_MAX_BODY_BYTES/,
    ],
    [{ GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: 'lots' }, /GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: expected a positive size/],
    [
      { GATEWAY_MAX_MESSAGE_BYTES: String(512 * 2 ** 20) },
      /GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: 268435456 bytes cannot hold one gRPC message of GATEWAY_MAX_MESSAGE_BYTES/,
    ],
    [{ GATEWAY_MAX_NAME_BYTES: '0' }, /GATEWAY_MAX_NAME_BYTES/],
  ])('refuses %j at start-up, naming the variable', (env, message) => {
    expect(() => loadGatewayConfig({ GATEWAY_API_KEYS: 'k1', ...env })).toThrow(message);
  });
});
