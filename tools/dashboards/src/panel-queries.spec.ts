import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { panelQueries, variableQueries } from './dashboards';
import { metricNamesIn, scanMetrics, type MetricType } from './defined-metrics';
import { workspaceRoot } from './main';

const catalog = scanMetrics(workspaceRoot());
const typeOf = new Map<string, MetricType>(catalog.definitions.map((d) => [d.name, d.type]));

/** The names an expression uses that no service defines. */
function undefinedNames(expr: string): string[] {
  return metricNamesIn(expr).filter((name) => !catalog.seriesNames.has(name));
}

/** Gauges an expression takes the rate() or increase() of: those only make sense of counters. */
function ratesOfGauges(expr: string): string[] {
  return [...expr.matchAll(/\b(?:rate|increase|irate)\(\s*(infermesh_[a-zA-Z0-9_:]+)/g)]
    .map((m) => m[1]!)
    .filter((name) => typeOf.get(name) === 'gauge');
}

describe('the metric catalog read from the services', () => {
  it('reads every definition: none whose name it cannot tell', () => {
    expect(catalog.unread).toEqual([]);
  });

  it.each([
    ['infermesh_gateway_inference_requests_total', 'counter'],
    ['infermesh_gateway_request_duration_seconds', 'histogram'],
    ['infermesh_batcher_queue_depth', 'gauge'],
    ['infermesh_batcher_worker_ejections_total', 'counter'],
    ['infermesh_registry_xds_events_total', 'counter'],
    ['infermesh_registry_model_versions', 'gauge'],
    // Defined in libs/grpc, which every service reaches through libs/runtime.
    ['infermesh_worker_grpc_server_handling_seconds', 'histogram'],
    ['infermesh_cache_grpc_server_tls_handshake_failures_total', 'counter'],
    // Defined in libs/registry-watch, which the router imports.
    ['infermesh_router_registry_watch_connected', 'gauge'],
  ])('knows %s, a %s', (name, type) => {
    expect(typeOf.get(name)).toBe(type);
  });

  it('gives a lib’s metrics only to the services that import the lib', () => {
    // The gateway does not follow the registry's WatchModels stream.
    expect(typeOf.has('infermesh_gateway_registry_watch_connected')).toBe(false);
    expect(undefinedNames('sum(infermesh_gateway_registry_watch_connected)')).toEqual([
      'infermesh_gateway_registry_watch_connected',
    ]);
  });

  it('knows the series of a histogram, and nothing made up', () => {
    expect(
      undefinedNames(
        'rate(infermesh_router_request_duration_seconds_bucket[5m]) / rate(infermesh_router_request_duration_seconds_count[5m])',
      ),
    ).toEqual([]);
    expect(undefinedNames('rate(infermesh_router_requests_total_bucket[5m])')).toEqual([
      'infermesh_router_requests_total_bucket',
    ]);
    expect(undefinedNames('sum(infermesh_router_no_such_thing)')).toEqual(['infermesh_router_no_such_thing']);
  });
});

describe('panelQueries()', () => {
  const queries = panelQueries();

  it('lists the queries of every board', () => {
    expect(new Set(queries.map((q) => q.board))).toEqual(
      new Set([
        'infermesh-slo',
        'infermesh-request-path',
        'infermesh-batcher',
        'infermesh-worker',
        'infermesh-rollouts',
        'infermesh-cache',
        'infermesh-mesh',
      ]),
    );
  });

  it.each(queries.map((q) => [q.board, q.panel, q.expr] as const))(
    '%s / %s: names only metrics the services define',
    (_board, _panel, expr) => {
      expect(metricNamesIn(expr).length).toBeGreaterThan(0);
      expect(undefinedNames(expr)).toEqual([]);
      expect(ratesOfGauges(expr)).toEqual([]);
    },
  );

  it.each(variableQueries().map((v) => [v.board, v.variable, v.query] as const))(
    '%s variable %s: names only metrics the services define',
    (_board, _variable, query) => {
      expect(undefinedNames(query)).toEqual([]);
    },
  );
});

// promtool ships with Debian's prometheus package (.ci/run installs it): it parses every query (variables filled in).
describe('promtool', () => {
  it('parses every panel query', () => {
    const version = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
    if (version.status !== 0) throw new Error('promtool is not installed: apt-get install prometheus (.ci/run does)');
    const dir = mkdtempSync(join(tmpdir(), 'infermesh-dashboards-'));
    try {
      const rules = panelQueries({ resolve: true }).map((q, i) => ({
        record: `infermesh:dashboard_query:${i}`,
        expr: q.expr,
        labels: { board: q.board, panel: q.panel },
      }));
      const file = join(dir, 'queries.rules.yaml');
      writeFileSync(file, stringify({ groups: [{ name: 'dashboard-queries', rules }] }));
      const result = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
      // On failure, promtool's own report names the rule (its number is the query's index in panelQueries()) and the parse error.
      expect(result.status === 0 ? 'parsed' : `${result.stdout}${result.stderr}`).toBe('parsed');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
