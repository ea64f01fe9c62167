import { METRICS_CONTENT_TYPES, type Metrics, type MetricsFormat } from '@infermesh/telemetry';
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { HealthDetails } from './health-details';

/**
 * The service's own HTTP port, apart from any public listener: Prometheus metrics at GET /metrics
 * (OpenMetrics, with exemplars, to a client that asks for it) and the health details as JSON at
 * GET /health (200 while the service is SERVING, 503 otherwise).
 */
export class MonitoringServer {
  private server: Server | undefined;

  constructor(
    private readonly metrics: Metrics,
    private readonly details: HealthDetails,
    /** When set, GET /metrics answers only `Authorization: Bearer <token>` (401 otherwise); /health stays open to probes. */
    private readonly metricsToken?: string,
  ) {}

  async listen(host: string, port: number): Promise<number> {
    const server = createServer((req, res) => this.handle(req, res));
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve());
    });
    return (server.address() as AddressInfo).port;
  }

  async close(): Promise<void> {
    const server = this.server;
    if (server === undefined) return;
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? '').split('?')[0];
    if (req.method === 'GET' && path === '/metrics') {
      if (this.metricsToken !== undefined && !bearerMatches(req.headers.authorization, this.metricsToken)) {
        res.writeHead(401, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer realm="metrics"' });
        res.end('metrics need the bearer token this service was given (INFERMESH_METRICS_TOKEN)\n');
        return;
      }
      const format = metricsFormatFor(req.headers.accept);
      this.metrics.render(format).then(
        (body) => {
          res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPES[format], vary: 'Accept' });
          res.end(body);
        },
        (error: unknown) => {
          res.writeHead(503, { 'content-type': 'text/plain' });
          res.end(`metrics unavailable: ${String(error)}\n`);
        },
      );
      return;
    }
    if (req.method === 'GET' && path === '/health') {
      const report = this.details.report();
      res.writeHead(report['status'] === 'SERVING' ? 200 : 503, { 'content-type': 'application/json' });
      res.end(
        `${JSON.stringify(report, (_key, value: unknown) => (typeof value === 'bigint' ? Number(value) : value))}\n`,
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found: metrics are served at GET /metrics, health details at GET /health\n');
  }
}

/**
 * The format a scraper asked for: OpenMetrics when its Accept header names
 * `application/openmetrics-text` at least as high as the Prometheus text format (Prometheus lists it
 * first when it scrapes), else the Prometheus text format, also for a wildcard and for no Accept at all.
 */
function metricsFormatFor(accept: string | undefined): MetricsFormat {
  let openMetrics = 0;
  const text = { exact: -1, type: -1, any: -1 };
  for (const range of (accept ?? '').split(',')) {
    const [mediaType = '', ...params] = range.split(';').map((part) => part.trim().toLowerCase());
    const qParam = params.find((param) => param.startsWith('q='));
    const parsed = qParam === undefined ? 1 : Number(qParam.slice(2));
    const q = Number.isFinite(parsed) ? Math.min(Math.max(parsed, 0), 1) : 0;
    if (mediaType === 'application/openmetrics-text') openMetrics = Math.max(openMetrics, q);
    else if (mediaType === 'text/plain') text.exact = Math.max(text.exact, q);
    else if (mediaType === 'text/*') text.type = Math.max(text.type, q);
    else if (mediaType === '*/*') text.any = Math.max(text.any, q);
  }
  // The most specific range that matches text/plain gives its quality (RFC 9110, 12.5.1).
  const textQ = text.exact >= 0 ? text.exact : text.type >= 0 ? text.type : Math.max(text.any, 0);
  return openMetrics > 0 && openMetrics >= textQ ? 'openmetrics' : 'prometheus';
}

/** Whether an Authorization header carries this bearer token, compared in constant time. */
function bearerMatches(header: string | undefined, token: string): boolean {
  const match = /^Bearer (.+)$/.exec(header ?? '');
  if (match === null) return false;
  const given = createHash('sha256').update(match[1]!).digest();
  return timingSafeEqual(given, createHash('sha256').update(token).digest());
}
