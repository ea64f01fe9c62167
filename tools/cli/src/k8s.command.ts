import { EnvoyApi } from '@infermesh/mesh';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { command, type GroupSpec } from './args';
import { CliError, EXIT } from './cli-errors';
import type { CommandContext, CommandHandler } from './command-context';
import { k8sGeneratedFiles } from './k8s/k8s-files';
import { RenderError, renderKustomization } from './k8s/kustomize';
import { autoscalerMetrics, checkManifests, type K8sObject, type Problem } from './k8s/manifest-checks';

/** The overlays the repository ships, and whether the production rules apply to each. */
export const SHIPPED_OVERLAYS: readonly { dir: string; production: boolean }[] = [
  { dir: 'k8s/overlays/local', production: false },
  { dir: 'k8s/overlays/production', production: true },
  { dir: 'k8s/overlays/gpu', production: true },
];

const repoRoot = (ctx: CommandContext) => resolve(ctx.io.distDir, '..');

/** `k8s generate`: writes the generated files under k8s/ (the mesh ConfigMap, the monitoring objects); --check only compares. */
async function generate(ctx: CommandContext): Promise<void> {
  const root = repoRoot(ctx);
  const files = k8sGeneratedFiles(root);
  const stale: string[] = [];
  for (const file of files) {
    const path = join(root, file.path);
    let current: string | undefined;
    try {
      current = readFileSync(path, 'utf8');
    } catch {
      current = undefined;
    }
    if (current === file.text) continue;
    stale.push(file.path);
    if (ctx.args.switch('check')) continue;
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, file.text);
  }
  if (ctx.args.switch('check')) {
    if (stale.length > 0)
      throw new CliError(`out of date (run \`npx infermesh k8s generate\`): ${stale.join(', ')}`, EXIT.failed);
    ctx.io.stdout.write(`${files.length} generated files up to date\n`);
    return;
  }
  ctx.io.stdout.write(
    stale.length === 0
      ? `${files.length} generated files up to date\n`
      : `${stale.map((p) => `wrote ${p}`).join('\n')}\n`,
  );
}

/** The metric families a service's /metrics declares (its `# TYPE` lines). */
async function scrapeMetricNames(url: string): Promise<Set<string>> {
  let text: string;
  try {
    const response = await fetch(url, { signal: AbortSignal.timeout(10_000) });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    text = await response.text();
  } catch (error) {
    throw new CliError(
      `--metrics: cannot scrape ${url}: ${error instanceof Error ? error.message : String(error)}`,
      EXIT.failed,
    );
  }
  return new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!));
}

/** Every metric an autoscaler reads is one a scraped service exposes. */
function metricProblems(objects: K8sObject[], exposed: ReadonlySet<string>): Problem[] {
  return autoscalerMetrics(objects)
    .filter((m) => !exposed.has(m.metric))
    .map((m) => ({
      object: m.object,
      message: `reads ${m.metric}, which none of the scraped services exposes (--metrics)`,
    }));
}

/** `k8s check`: renders each overlay with kubectl kustomize and runs every check on what it renders. */
async function check(ctx: CommandContext): Promise<void> {
  const root = repoRoot(ctx);
  const given = ctx.args.positionals;
  const overlays =
    given.length === 0
      ? SHIPPED_OVERLAYS.map((o) => ({ dir: join(root, o.dir), production: o.production }))
      : given.map((dir) => ({ dir: resolve(dir), production: ctx.args.switch('production') }));
  const envoy = EnvoyApi.load();
  const urls = ctx.args
    .list('metrics')
    .flatMap((v) => v.split(','))
    .filter((v) => v !== '');
  const exposed = new Set<string>();
  for (const url of urls) for (const name of await scrapeMetricNames(url)) exposed.add(name);
  let failed = 0;
  for (const overlay of overlays) {
    const name = relative(process.cwd(), overlay.dir) || '.';
    let objects;
    try {
      objects = await renderKustomization(overlay.dir);
    } catch (error) {
      if (error instanceof RenderError) throw new CliError(error.message, EXIT.failed);
      throw error;
    }
    const problems = [
      ...checkManifests(objects, { production: overlay.production, envoy }),
      ...(urls.length === 0 ? [] : metricProblems(objects, exposed)),
    ];
    if (problems.length > 0) failed += 1;
    ctx.io.stdout.write(
      problems.length === 0
        ? `${name}: ok (${objects.length} objects${overlay.production ? ', production rules' : ''})\n`
        : problems.map((p) => `${name}: ${p.object}: ${p.message}\n`).join(''),
    );
  }
  if (failed > 0) throw new CliError(`${failed} of ${overlays.length} kustomizations fail the checks`, EXIT.failed);
}

/** `infermesh k8s ...`: the Kubernetes manifests under k8s/. */
export const K8S_GROUP: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'k8s',
  summary: 'The Kubernetes manifests (k8s/): regenerate their generated parts, check what each overlay renders',
  flags: [],
  commands: [
    command<CommandHandler>({
      name: 'generate',
      summary:
        'Write the generated files under k8s/ from envoy/mesh.yaml and grafana/ (the mesh ConfigMap, SLO rules, boards)',
      positionals: [],
      flags: [
        { name: 'check', kind: 'switch', description: 'Write nothing; fail when a generated file is out of date' },
      ],
      handler: generate,
    }),
    command<CommandHandler>({
      name: 'check',
      summary:
        'Render each kustomization (kubectl kustomize) and check it: schemas, probes, resources, security, sidecars, Services, autoscalers',
      details: [
        'Without arguments: the shipped overlays (local; production and gpu with the production rules).',
        'The production rules: 3 replicas or more per tier, a PodDisruptionBudget, a spread over zones and hosts,',
        'a default-deny NetworkPolicy. Each problem names its object; exit 1 when there is one.',
      ].join('\n'),
      positionals: [{ name: '[kustomization-dir...]', optional: true, variadic: true }],
      flags: [
        { name: 'production', kind: 'switch', description: 'Apply the production rules to the given kustomizations' },
        {
          name: 'metrics',
          kind: 'list',
          placeholder: '<url>',
          description:
            "Running services' /metrics URLs (repeated or comma-separated): every metric an autoscaler reads must be one of theirs",
        },
      ],
      handler: check,
    }),
  ],
};
