import { HealthService, ServingStatus } from '@infermesh/grpc';
import { Metrics } from '@infermesh/telemetry';
import { request } from 'node:http';
import { HealthDetails } from './health-details';
import { MonitoringServer } from './monitoring-server';

function get(port: number, path: string, method = 'GET', headers: Record<string, string> = {}): Promise<{ status: number; type: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: String(res.headers['content-type']), body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe(MonitoringServer.name, () => {
  let metrics: Metrics;
  let health: HealthService;
  let details: HealthDetails;
  let sut: MonitoringServer;
  let port: number;

  beforeEach(async () => {
    metrics = new Metrics('router');
    metrics.counter('requests_total', 'Requests.').inc(3);
    health = new HealthService();
    details = new HealthDetails('router', health);
    sut = new MonitoringServer(metrics, details);
    port = await sut.listen('127.0.0.1', 0);
  });

  afterEach(async () => {
    await sut.close();
  });

  it('asks for the metrics token when it has one, and keeps /health open to probes', async () => {
    const guarded = new MonitoringServer(metrics, details, 'a-token-of-sixteen-chars');
    const guardedPort = await guarded.listen('127.0.0.1', 0);
    try {
      expect((await get(guardedPort, '/metrics')).status).toBe(401);
      expect((await get(guardedPort, '/metrics', 'GET', { authorization: 'Bearer a-wrong-token-of-sixteen' })).status).toBe(401);
      const allowed = await get(guardedPort, '/metrics', 'GET', { authorization: 'Bearer a-token-of-sixteen-chars' });
      expect(allowed.status).toBe(200);
      expect(allowed.body).toContain('infermesh_router_requests_total 3');
      expect((await get(guardedPort, '/health')).status).toBe(503);
    } finally {
      await guarded.close();
    }
  });

  it('serves the metrics in the Prometheus text format at GET /metrics, with or without a query string', async () => {
    for (const path of ['/metrics', '/metrics?name[]=x']) {
      const response = await get(port, path);

      expect(response.status).toBe(200);
      expect(response.type).toBe(metrics.registry.contentType);
      expect(response.body).toContain('infermesh_router_requests_total 3');
    }
  });

  it('serves the health status and every registered section as JSON at GET /health, 200 while SERVING', async () => {
    health.set('', ServingStatus.SERVING);
    let connected = false;
    details.register('registry', () => ({ connected, revision: 12n, serving_last_config: !connected }));

    const response = await get(port, '/health');

    expect(response.status).toBe(200);
    expect(response.type).toBe('application/json');
    expect(JSON.parse(response.body)).toEqual({
      service: 'router',
      status: 'SERVING',
      registry: { connected: false, revision: 12, serving_last_config: true },
    });

    connected = true;
    expect(JSON.parse((await get(port, '/health')).body)).toMatchObject({ registry: { connected: true, serving_last_config: false } });
  });

  it('answers 503 with the status while the service is not SERVING', async () => {
    health.set('', ServingStatus.NOT_SERVING);
    const notServing = await get(port, '/health');
    expect(notServing.status).toBe(503);
    expect(JSON.parse(notServing.body)).toEqual({ service: 'router', status: 'NOT_SERVING' });

    expect(JSON.parse((await get(port, '/health?verbose=1')).body)).toMatchObject({ status: 'NOT_SERVING' });
  });

  it('says UNKNOWN before the service has set any status', async () => {
    const response = await get(port, '/health');

    expect(response.status).toBe(503);
    expect(JSON.parse(response.body)).toEqual({ service: 'router', status: 'UNKNOWN' });
  });

  it('reports a section that throws as its error, keeping the others', async () => {
    health.set('', ServingStatus.SERVING);
    details.register('broken', () => {
      throw new Error('section failed');
    });
    details.register('fine', () => ({ ok: true }));

    expect(JSON.parse((await get(port, '/health')).body)).toEqual({
      service: 'router',
      status: 'SERVING',
      broken: { error: 'section failed' },
      fine: { ok: true },
    });
  });

  it.each([
    ['GET', '/'],
    ['GET', '/healthz'],
    ['POST', '/health'],
    ['POST', '/metrics'],
  ])('answers 404 to %s %s, saying where metrics and health are', async (method, path) => {
    const response = await get(port, path, method);

    expect(response.status).toBe(404);
    expect(response.body).toContain('GET /metrics');
    expect(response.body).toContain('GET /health');
  });

  it('stops listening on close', async () => {
    await sut.close();

    await expect(get(port, '/health')).rejects.toThrow(/ECONNREFUSED/);
  });
});

describe(HealthDetails.name, () => {
  it('refuses a section name taken, or one that is a field of the report', () => {
    const sut = new HealthDetails('router', new HealthService());
    sut.register('registry', () => ({}));

    expect(() => sut.register('registry', () => ({}))).toThrow(/"registry" is registered already/);
    expect(() => sut.register('status', () => ({}))).toThrow(/"status" is not a health section name/);
    sut.unregister('registry');
    expect(() => sut.register('registry', () => ({}))).not.toThrow();
  });
});
