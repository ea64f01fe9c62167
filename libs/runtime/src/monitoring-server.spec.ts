import { HealthService, ServingStatus } from '@infermesh/grpc';
import { METRICS_CONTENT_TYPES, Metrics, requestContext } from '@infermesh/telemetry';
import { trace, TraceFlags } from '@opentelemetry/api';
import { request } from 'node:http';
import { HealthDetails } from './health-details';
import { MonitoringServer } from './monitoring-server';

function get(
  port: number,
  path: string,
  method = 'GET',
  headers: Record<string, string> = {},
): Promise<{ status: number; type: string; body: string }> {
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
      expect(
        (await get(guardedPort, '/metrics', 'GET', { authorization: 'Bearer a-wrong-token-of-sixteen' })).status,
      ).toBe(401);
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
      expect(response.type).toBe(METRICS_CONTENT_TYPES.prometheus);
      expect(response.body).toContain('infermesh_router_requests_total 3');
    }
  });

  it.each([
    [
      'Prometheus 2',
      'application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1',
    ],
    [
      'Prometheus 3',
      'application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2',
    ],
    ['a bare media type', 'application/openmetrics-text'],
  ])('serves OpenMetrics, with the exemplars, to a client that asks for it first (%s)', async (_client, accept) => {
    const latency = metrics.histogram('latency_seconds', 'Latency.', [], [0.1, 1], { exemplars: true });
    const span = trace.wrapSpanContext({
      traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
      spanId: '00f067aa0ba902b7',
      traceFlags: TraceFlags.SAMPLED,
    });
    requestContext.run({ requestId: 'r', span }, () => metrics.observe(latency, {}, 0.05));

    const response = await get(port, '/metrics', 'GET', { accept });

    expect(response.status).toBe(200);
    expect(response.type).toBe(METRICS_CONTENT_TYPES.openmetrics);
    expect(response.body).toContain('# TYPE infermesh_router_requests counter\n');
    expect(response.body).toContain('\ninfermesh_router_requests_total 3\n');
    expect(response.body).toMatch(
      /^infermesh_router_latency_seconds_bucket\{le="0\.1"\} 1 # \{trace_id="4bf92f3577b34da6a3ce929d0e0e4736",span_id="00f067aa0ba902b7"\} 0\.05 /m,
    );
    expect(response.body.endsWith('\n# EOF\n')).toBe(true);
  });

  it.each([
    ['no Accept', undefined],
    ['a wildcard', '*/*'],
    ['the text format only', 'text/plain;version=0.0.4'],
    ['the text format first', 'text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5'],
    ['OpenMetrics refused', 'application/openmetrics-text;q=0,*/*'],
  ])('serves the Prometheus text format, without exemplars, to a client that sends %s', async (_client, accept) => {
    const latency = metrics.histogram('latency_seconds', 'Latency.', [], [0.1, 1], { exemplars: true });
    const span = trace.wrapSpanContext({
      traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
      spanId: '00f067aa0ba902b7',
      traceFlags: TraceFlags.SAMPLED,
    });
    requestContext.run({ requestId: 'r', span }, () => metrics.observe(latency, {}, 0.05));

    const response = await get(port, '/metrics', 'GET', accept === undefined ? {} : { accept });

    expect(response.status).toBe(200);
    expect(response.type).toBe(METRICS_CONTENT_TYPES.prometheus);
    expect(response.body).toContain('# TYPE infermesh_router_requests_total counter\n');
    expect(response.body).toContain('infermesh_router_latency_seconds_bucket{le="0.1"} 1\n');
    expect(response.body).not.toContain('trace_id');
    expect(response.body).not.toContain('# EOF');
  });

  it('asks for the metrics token in OpenMetrics too', async () => {
    const guarded = new MonitoringServer(metrics, details, 'a-token-of-sixteen-chars');
    const guardedPort = await guarded.listen('127.0.0.1', 0);
    const accept = 'application/openmetrics-text;version=1.0.0';
    try {
      const refused = await get(guardedPort, '/metrics', 'GET', { accept });
      expect(refused.status).toBe(401);
      expect(refused.body).not.toContain('infermesh_router');
      const allowed = await get(guardedPort, '/metrics', 'GET', {
        accept,
        authorization: 'Bearer a-token-of-sixteen-chars',
      });
      expect(allowed.status).toBe(200);
      expect(allowed.type).toBe(METRICS_CONTENT_TYPES.openmetrics);
    } finally {
      await guarded.close();
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
    expect(JSON.parse((await get(port, '/health')).body)).toMatchObject({
      registry: { connected: true, serving_last_config: false },
    });
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
