import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { parse } from 'yaml';
import { REGENERATE, SLO_DIR, SPEC_FILE, sloFiles, staleFiles } from './slo-files';
import type { AlertingRule, RuleGroup } from './slo-rules';

const ROOT = join(__dirname, '..', '..', '..');
const DIR = join(ROOT, SLO_DIR);
const files = sloFiles(readFileSync(join(DIR, SPEC_FILE), 'utf8'));
const groups = (parse(files[0]!.text) as { groups: RuleGroup[] }).groups;
const alerts = groups.flatMap((g) => g.rules).filter((r): r is AlertingRule => 'alert' in r);

/** Metric names each service defines in its source (metrics.counter('name', ...)), prefixed as libs/telemetry's Metrics does. */
function definedMetrics(): Set<string> {
  const read = (dir: string): string[] =>
    readdirSync(dir, { recursive: true, encoding: 'utf8' })
      .filter((f) => f.endsWith('.ts') && !f.endsWith('.spec.ts'))
      .map((f) => readFileSync(join(dir, f), 'utf8'));
  const names = (sources: string[]) =>
    sources.flatMap((s) => [...s.matchAll(/\.(?:counter|gauge|histogram)\(\s*'([a-z0-9_]+)'/g)].map((m) => m[1]!));
  const shared = names(['registry-watch', 'grpc', 'runtime'].flatMap((lib) => read(join(ROOT, 'libs', lib, 'src'))));
  const defined = new Set<string>();
  for (const service of ['gateway', 'registry', 'router', 'batcher', 'worker', 'cache']) {
    for (const name of [...names(read(join(ROOT, 'services', service, 'src'))), ...shared])
      defined.add(`infermesh_${service}_${name}`);
  }
  return defined;
}

describe('grafana/slo', () => {
  it.each(files.map((f) => [f.path, f] as const))(
    `%s is what tools/slo generates from slos.yaml (regenerate with \`${REGENERATE}\`)`,
    (path, file) => {
      const committed = join(DIR, path);
      expect(existsSync(committed) ? readFileSync(committed, 'utf8') : `(${path} is missing)`).toBe(file.text);
    },
  );

  it(`holds no generated test the spec no longer produces (regenerate with \`${REGENERATE}\`, which deletes them)`, () => {
    expect(staleFiles(DIR, files)).toEqual([]);
  });

  it('reads only metrics the services define, under their infermesh_<service>_ names', () => {
    const defined = definedMetrics();
    const used = new Set(
      groups
        .flatMap((g) => g.rules.map((r) => r.expr))
        // Raw metrics only: not the recorded SLIs (model:infermesh_…), nor the pattern that ends at `(`.
        .flatMap((expr) => [...expr.matchAll(/(?<![:\w])infermesh_[a-z0-9_]+(?!\()/g)].map((m) => m[0]))
        .map((name) => name.replace(/_(bucket|count|sum)$/, '')),
    );
    // The registry watch is read by a name pattern: each follower's.
    for (const service of ['router', 'batcher', 'worker'])
      used.add(`infermesh_${service}_registry_watch_config_age_seconds`);

    expect([...used].filter((name) => !defined.has(name))).toEqual([]);
    expect(used.size).toBeGreaterThanOrEqual(12);
  });

  it("selects the gateway's inference endpoints and outcomes by the values its code gives them", () => {
    // Found by name wherever it sits under the gateway's src/ (its folders may change).
    const src = join(ROOT, 'services', 'gateway', 'src');
    const gateway = (file: string) => {
      const found = readdirSync(src, { recursive: true, encoding: 'utf8' }).filter((path) => basename(path) === file);
      expect([file, found.length]).toEqual([file, 1]);
      return readFileSync(join(src, found[0]!), 'utf8');
    };

    expect(gateway('gateway.http.ts')).toContain("@Controller('v2')");
    expect(gateway('gateway.http.ts')).toContain("@Post('models/:model/infer')");
    expect(gateway('gateway.http.ts')).toContain("@Post('models/:model/versions/:version/infer')");
    expect(gateway('gateway.grpc.ts')).toContain("this.handle('ModelInfer',");
    expect(gateway('model-inference.ts')).toContain("countInference('(not routed)', '', 'overloaded')");
    expect(gateway('model-inference.ts')).toContain('(status[code] ?? String(code)).toLowerCase()');
    expect(gateway('gateway-metrics.ts')).toContain("new Set(['ok', 'cached', 'degraded'])");
  });

  it('gives every alert a severity (page or ticket), a summary, a description and a runbook', () => {
    expect(alerts.length).toBeGreaterThan(0);
    for (const alert of alerts) {
      expect([alert.alert, ['page', 'ticket'].includes(alert.labels.severity)]).toEqual([alert.alert, true]);
      expect([alert.alert, Object.keys(alert.annotations).sort()]).toEqual([
        alert.alert,
        ['description', 'runbook', 'summary'],
      ]);
      for (const text of Object.values(alert.annotations)) expect(text.length).toBeGreaterThan(20);
    }
  });

  it('records every SLI over every window of the alerts, and pages and tickets for every objective', () => {
    const records = groups.flatMap((g) => g.rules).flatMap((r) => ('record' in r ? [r.record] : []));
    for (const what of [
      'infermesh:inference_errors',
      'model:infermesh_inference_errors',
      'infermesh:inference_slow',
      'model:infermesh_inference_slow',
    ]) {
      const windows = records.filter((r) => r.startsWith(`${what}:`)).map((r) => r.slice(`${what}:ratio_rate`.length));
      expect([what, [...new Set(windows)]]).toEqual([what, ['5m', '30m', '1h', '2h', '6h', '1d', '3d']]);
    }
    const burn = alerts
      .filter((a) => a.alert.endsWith('BudgetBurn'))
      .map((a) => `${a.labels['slo']} ${a.labels.severity}`);
    expect(burn).toHaveLength(12);
    expect(new Set(burn).size).toBe(12);
  });

  it('has a promtool test for every alert', () => {
    const tested = new Set(
      files
        .slice(1)
        .flatMap((f) => (parse(f.text) as { tests: { alert_rule_test: { alertname: string }[] }[] }).tests)
        .flatMap((t) => t.alert_rule_test.map((c) => c.alertname)),
    );

    expect(alerts.map((a) => a.alert).filter((name) => !tested.has(name))).toEqual([]);
  });
});
