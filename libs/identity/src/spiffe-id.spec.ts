import { serviceOfSpiffeId, spiffeId } from './spiffe-id';

describe(spiffeId.name, () => {
  it('names a service of the default trust domain', () => {
    expect(spiffeId('worker')).toBe('spiffe://infermesh.local/worker');
    expect(spiffeId('router', 'prod.example')).toBe('spiffe://prod.example/router');
  });

  it.each(['', 'Worker', 'a/b', 'a.b', 'worker_1', 'x'.repeat(64)])('refuses the service name %j', (service) => {
    expect(() => spiffeId(service)).toThrow(/invalid service name/);
  });

  it('refuses a trust domain that cannot be one', () => {
    expect(() => spiffeId('worker', 'Infermesh.local')).toThrow(/invalid SPIFFE trust domain/);
    expect(() => spiffeId('worker', 'a/b')).toThrow(/invalid SPIFFE trust domain/);
  });
});

describe(serviceOfSpiffeId.name, () => {
  it('reads the service back', () => {
    expect(serviceOfSpiffeId('spiffe://infermesh.local/batcher')).toBe('batcher');
    expect(serviceOfSpiffeId(spiffeId('model-cache', 'other.td'), 'other.td')).toBe('model-cache');
  });

  it.each([
    'spiffe://other.local/worker',
    'spiffe://infermesh.local.evil/worker',
    'SPIFFE://infermesh.local/worker',
    'https://infermesh.local/worker',
    'spiffe://infermesh.local:443/worker',
    'spiffe://user@infermesh.local/worker',
    'spiffe://infermesh.local/',
    'spiffe://infermesh.local',
    'spiffe://infermesh.local/worker/',
    'spiffe://infermesh.local/worker/extra',
    'spiffe://infermesh.local/Worker',
    'spiffe://infermesh.local/..',
    'spiffe://infermesh.local/work%65r',
    'spiffe://infermesh.local/worker?x=1',
    'spiffe://infermesh.local/worker#x',
    ' spiffe://infermesh.local/worker',
    'spiffe://infermesh.local/worker\n',
  ])('refuses %j', (id) => {
    expect(serviceOfSpiffeId(id)).toBeUndefined();
  });
});
