import { request } from 'node:http';
import type { Counter } from 'prom-client';
import { LATENCY_BUCKETS_SECONDS, Metrics, MetricsServer } from './metrics';

/** A GET or POST over a fresh connection, so that close() is not held up by keep-alive. */
function get(port: number, path: string, method = 'GET'): Promise<{ status: number; type: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: String(res.headers['content-type']), body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe(Metrics.name, () => {
  it('names every metric infermesh_<service>_<name>, default process metrics included', async () => {
    const sut = new Metrics('router');
    sut.counter('requests_total', 'Requests.', ['outcome']).inc({ outcome: 'hit' }, 3);
    sut.gauge('inflight', 'In flight.').set(2);
    sut.histogram('latency_seconds', 'Latency.').observe(0.003);

    const text = await sut.render();

    expect(text).toContain('infermesh_router_requests_total{outcome="hit"} 3');
    expect(text).toContain('infermesh_router_inflight 2');
    expect(text).toContain('infermesh_router_latency_seconds_count 1');
    expect(text).toContain('infermesh_router_process_cpu_user_seconds_total');
    const names = text.split('\n').filter((line) => line !== '' && !line.startsWith('#')).map((line) => line.split(/[{ ]/)[0]);
    expect(names.filter((name) => !name!.startsWith('infermesh_router_'))).toEqual([]);
  });

  it('uses latency buckets from 100 µs to 10 s unless told otherwise', async () => {
    const sut = new Metrics('worker');
    sut.histogram('default_seconds', 'Default.').observe(0.00005);
    sut.histogram('custom_seconds', 'Custom.', [], [1, 2]).observe(1.5);

    const text = await sut.render();

    for (const bucket of LATENCY_BUCKETS_SECONDS) expect(text).toContain(`infermesh_worker_default_seconds_bucket{le="${bucket}"} 1`);
    expect(text).toContain('infermesh_worker_custom_seconds_bucket{le="1"} 0');
    expect(text).toContain('infermesh_worker_custom_seconds_bucket{le="2"} 1');
    expect(text).not.toContain('infermesh_worker_custom_seconds_bucket{le="0.0001"}');
  });

  it('keeps each instance in its own registry', async () => {
    const one = new Metrics('svc');
    const two = new Metrics('svc');
    one.counter('calls_total', 'Calls.').inc();
    two.counter('calls_total', 'Calls.').inc(5);

    expect(await one.render()).toContain('infermesh_svc_calls_total 1');
    expect(await two.render()).toContain('infermesh_svc_calls_total 5');
  });
});

describe(MetricsServer.name, () => {
  let metrics: Metrics;
  let requests: Counter;
  let sut: MetricsServer;
  let port: number;

  beforeEach(async () => {
    metrics = new Metrics('gateway');
    requests = metrics.counter('http_requests_total', 'HTTP requests.');
    requests.inc(7);
    sut = new MetricsServer(metrics);
    port = await sut.listen('127.0.0.1', 0);
  });

  afterEach(async () => {
    await sut.close();
  });

  it('serves the registry in the Prometheus text format at GET /metrics', async () => {
    const response = await get(port, '/metrics');

    expect(response.status).toBe(200);
    expect(response.type).toBe(metrics.registry.contentType);
    expect(response.body).toContain('infermesh_gateway_http_requests_total 7');
    expect(response.body).toContain('# TYPE infermesh_gateway_http_requests_total counter');
  });

  it('serves the current values on each scrape and accepts a query string', async () => {
    expect((await get(port, '/metrics')).body).toContain('infermesh_gateway_http_requests_total 7');
    requests.inc();

    expect((await get(port, '/metrics?name[]=x')).body).toContain('infermesh_gateway_http_requests_total 8');
  });

  it.each([
    ['GET', '/'],
    ['GET', '/metricsx'],
    ['GET', '/v2/health/ready'],
    ['POST', '/metrics'],
  ])('answers 404 to %s %s, saying where metrics are', async (method, path) => {
    const response = await get(port, path, method);

    expect(response.status).toBe(404);
    expect(response.body).toContain('GET /metrics');
  });

  it('stops listening on close', async () => {
    await sut.close();

    await expect(get(port, '/metrics')).rejects.toThrow(/ECONNREFUSED/);
  });

  it('rejects listen on a port already in use', async () => {
    const other = new MetricsServer(metrics);

    await expect(other.listen('127.0.0.1', port)).rejects.toThrow(/EADDRINUSE/);
  });

  it('closes without error when it never listened', async () => {
    await expect(new MetricsServer(metrics).close()).resolves.toBeUndefined();
  });
});
