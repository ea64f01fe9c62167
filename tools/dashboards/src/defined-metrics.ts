// The metrics the services define, read from their source: what a board may name. A metric is
// defined by a call on a service's Metrics (libs/telemetry) — `metrics.counter('name', …)`,
// `.gauge(…)`, `.histogram(…)` — or by a prom-client metric built on its prefix
// (`new Gauge({ name: \`${metrics.prefix}name\` … })`). A definition in services/<service>/ is that
// service's; one in libs/<lib>/ belongs to every service that imports the lib, directly or through
// other libs. Specs, test helpers (libs/testing, */testing/) and generated code are not read.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';

export type MetricType = 'counter' | 'gauge' | 'histogram' | 'summary';

export interface MetricDefinition {
  /** As exposed, e.g. `infermesh_router_request_duration_seconds`. */
  name: string;
  type: MetricType;
  service: string;
  /** The file that defines it, relative to the workspace root. */
  file: string;
}

/** A call that looks like a metric definition but whose name is not a literal: the scan cannot tell what it defines. */
export interface UnreadDefinition {
  file: string;
  text: string;
}

export interface MetricCatalog {
  definitions: MetricDefinition[];
  unread: UnreadDefinition[];
  /** Every series name a query may use: the metrics, and `_bucket`, `_sum`, `_count` of histograms (and `_sum`, `_count` of summaries). */
  seriesNames: Set<string>;
}

interface SourceFile {
  project: string;
  path: string;
  text: string;
}

const LIBRARY_IMPORT = /from\s+'@infermesh\/([a-z0-9-]+)(?:\/[^']*)?'/g;
/** `.counter('name'` (also across lines, and with type arguments: `.gauge<L>(`). */
const FACTORY_CALL = /\.(counter|gauge|histogram|summary)\s*(?:<[^>()]*>)?\(\s*(?:'([^']*)'|"([^"]*)"|([^\s,)]+))/g;
/** `new Gauge({ name: \`${metrics.prefix}name\``. */
const PREFIXED_CONSTRUCTOR =
  /new\s+(?:\w+\.)?(Counter|Gauge|Histogram|Summary)\s*(?:<[^>()]*>)?\(\s*\{\s*name:\s*(?:`\$\{[\w.]+\.prefix\}([a-z0-9_]+)`|([^,}]+))/g;

/**
 * Not read: the Metrics class itself (its counter(), gauge() and histogram() build prom-client
 * metrics from the name they are given), and the event-loop delay figures, which stand in for
 * prom-client's under Node's standard names (`nodejs_eventloop_lag_*`), as its other default metrics
 * do: none is an infermesh_ metric.
 */
const NOT_READ = new Set(['libs/telemetry/src/metrics.ts', 'libs/telemetry/src/event-loop-delay.ts']);

function sourceFiles(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory())
      return entry.name === 'testing' || entry.name === 'gen' || entry.name === 'node_modules' ? [] : sourceFiles(path);
    return entry.name.endsWith('.ts') &&
      !entry.name.endsWith('.spec.ts') &&
      !entry.name.endsWith('.d.ts') &&
      !entry.name.includes('.testing.')
      ? [path]
      : [];
  });
}

function projects(root: string, kind: 'services' | 'libs'): string[] {
  const dir = join(root, kind);
  return existsSync(dir)
    ? readdirSync(dir, { withFileTypes: true })
        .filter((e) => e.isDirectory() && e.name !== 'testing')
        .map((e) => e.name)
        .sort()
    : [];
}

/** The libs a project imports, directly or through other libs. */
function libClosure(start: string, imports: Map<string, Set<string>>): Set<string> {
  const seen = new Set<string>();
  const pending = [...(imports.get(start) ?? [])];
  while (pending.length > 0) {
    const lib = pending.pop()!;
    if (seen.has(lib)) continue;
    seen.add(lib);
    pending.push(...(imports.get(`libs/${lib}`) ?? []));
  }
  return seen;
}

/** Reads the metric definitions of every service under `root` (the workspace root). */
export function scanMetrics(root: string): MetricCatalog {
  const files: SourceFile[] = [];
  const imports = new Map<string, Set<string>>();
  for (const kind of ['services', 'libs'] as const) {
    for (const name of projects(root, kind)) {
      const project = `${kind}/${name}`;
      const libs = new Set<string>();
      for (const path of sourceFiles(join(root, kind, name, 'src'))) {
        const text = readFileSync(path, 'utf8');
        files.push({ project, path: relative(root, path).split(sep).join('/'), text });
        for (const match of text.matchAll(LIBRARY_IMPORT)) libs.add(match[1]!);
      }
      imports.set(project, libs);
    }
  }

  // What each project defines, by bare name.
  const own = new Map<string, { name: string; type: MetricType; file: string }[]>();
  const unread: UnreadDefinition[] = [];
  for (const file of files) {
    if (NOT_READ.has(file.path)) continue;
    const list = own.get(file.project) ?? [];
    own.set(file.project, list);
    for (const match of file.text.matchAll(FACTORY_CALL)) {
      const name = match[2] ?? match[3];
      if (name !== undefined) list.push({ name, type: match[1] as MetricType, file: file.path });
      else unread.push({ file: file.path, text: match[0] });
    }
    for (const match of file.text.matchAll(PREFIXED_CONSTRUCTOR)) {
      if (match[2] !== undefined)
        list.push({ name: match[2], type: match[1]!.toLowerCase() as MetricType, file: file.path });
      else unread.push({ file: file.path, text: match[0] });
    }
  }

  const definitions: MetricDefinition[] = [];
  for (const service of projects(root, 'services')) {
    const sources = [
      `services/${service}`,
      ...[...libClosure(`services/${service}`, imports)].map((lib) => `libs/${lib}`),
    ];
    for (const source of sources) {
      for (const { name, type, file } of own.get(source) ?? [])
        definitions.push({ name: `infermesh_${service}_${name}`, type, service, file });
    }
  }

  const seriesNames = new Set<string>();
  for (const { name, type } of definitions) {
    seriesNames.add(name);
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) seriesNames.add(name + suffix);
    if (type === 'summary') for (const suffix of ['_sum', '_count']) seriesNames.add(name + suffix);
  }
  return { definitions, unread, seriesNames };
}

/** The `infermesh_…` names an expression uses. */
export function metricNamesIn(expr: string): string[] {
  return [...new Set(expr.match(/\binfermesh_[a-zA-Z0-9_:]+/g) ?? [])];
}
