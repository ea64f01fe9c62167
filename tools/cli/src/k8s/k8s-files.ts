import { envoyConfigFiles, envoySdsFiles, parseMeshPolicy } from '@infermesh/mesh';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml, stringify } from 'yaml';

/** A file `infermesh k8s generate` writes under k8s/, from the sources elsewhere in the repository. */
export interface GeneratedFile {
  /** Relative to the repository root. */
  path: string;
  text: string;
}

/** The ConfigMap every sidecar mounts at the policy's sidecar.configDir, and the registry reads the policy from. */
export const MESH_CONFIG_MAP = 'infermesh-mesh';
export const MESH_CONFIG_MAP_FILE = 'k8s/components/envoy-sidecar/generated/mesh-config.yaml';
export const MONITORING_GENERATED_DIR = 'k8s/components/monitoring/generated';

/** The Prometheus the monitoring component and the autoscalers query (kube-prometheus-stack's, in namespace monitoring). */
export const PROMETHEUS_IN_CLUSTER = 'http://prometheus-operated.monitoring.svc:9090';

const YAML_OPTIONS = { lineWidth: 0, aliasDuplicateObjects: false, blockQuote: 'literal' } as const;

function header(what: string, from: string): string {
  return `# ${what}\n# Generated from ${from} by \`npx infermesh k8s generate\`: do not edit.\n`;
}

/**
 * The mesh's ConfigMap: the policy (for the registry, which serves it over ADS), each service's
 * sidecar bootstrap in ADS mode and the file-based SDS files, each checked against Envoy's API by
 * the caller. Kustomize cannot read files outside the kustomization, so they travel in one object.
 */
export function meshConfigMap(policyText: string, policySource = 'envoy/mesh.yaml'): { configMap: Record<string, unknown>; files: ReturnType<typeof envoyConfigFiles>; sds: ReturnType<typeof envoySdsFiles> } {
  const policy = parseMeshPolicy(policyText, policySource);
  const files = envoyConfigFiles(policy, 'ads', policySource);
  const sds = envoySdsFiles(policy, policySource);
  const data: Record<string, string> = { 'mesh.yaml': policyText };
  for (const file of [...files, ...sds]) data[file.fileName] = file.text;
  return { configMap: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: MESH_CONFIG_MAP }, data }, files, sds };
}

/** The files of a mesh ConfigMap (file name → text), as a rendered manifest holds them. */
export function meshConfigMapFiles(configMap: unknown): Record<string, string> {
  const data = (configMap as { data?: Record<string, string> } | undefined)?.data;
  return data ?? {};
}

/** The SLO rules (grafana/slo/rules.yaml) as a Prometheus Operator PrometheusRule. */
function prometheusRule(rulesText: string): Record<string, unknown> {
  const rules = parseYaml(rulesText) as { groups: unknown[] };
  return {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PrometheusRule',
    metadata: { name: 'infermesh-slo', labels: { 'app.kubernetes.io/part-of': 'infermesh' } },
    spec: { groups: rules.groups },
  };
}

/**
 * Grafana's boards and datasource as ConfigMaps that Grafana's sidecar loads (labels grafana_dashboard
 * and grafana_datasource): one per board, each well under the size `kubectl apply` can annotate.
 */
function grafanaConfigMaps(root: string): Record<string, unknown>[] {
  const boards = join(root, 'grafana', 'dashboards');
  const dashboards = readdirSync(boards)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((file) => ({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: `grafana-board-${file.replace(/\.json$/, '')}`, labels: { grafana_dashboard: '1' }, annotations: { grafana_folder: 'infermesh' } },
      data: { [file]: readFileSync(join(boards, file), 'utf8') },
    }));
  // In the cluster: the Prometheus Operator's Prometheus, and not the default datasource (Grafana's
  // chart provisions one, and Grafana refuses two); the boards name this one by its uid.
  const datasource = parseYaml(readFileSync(join(root, 'grafana', 'provisioning', 'datasources', 'prometheus.yaml'), 'utf8')) as { datasources: Record<string, unknown>[] };
  for (const source of datasource.datasources) Object.assign(source, { url: PROMETHEUS_IN_CLUSTER, isDefault: false });
  return [
    ...dashboards,
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'infermesh-grafana-datasource', labels: { grafana_datasource: '1' } },
      data: { 'infermesh-prometheus.yaml': stringify(datasource, YAML_OPTIONS) },
    },
  ];
}

/** Everything `infermesh k8s generate` writes, from envoy/mesh.yaml and grafana/ of the repository at `root`. */
export function k8sGeneratedFiles(root: string): GeneratedFile[] {
  const { configMap } = meshConfigMap(readFileSync(join(root, 'envoy', 'mesh.yaml'), 'utf8'));
  const grafana = grafanaConfigMaps(root);
  return [
    {
      path: MESH_CONFIG_MAP_FILE,
      text: header('The mesh policy and every sidecar\'s Envoy bootstrap (ADS) and SDS files, mounted at /etc/envoy.', 'envoy/mesh.yaml') + stringify(configMap, YAML_OPTIONS),
    },
    {
      path: `${MONITORING_GENERATED_DIR}/prometheus-rule.yaml`,
      text: header('The SLO recording and alerting rules, for the Prometheus Operator.', 'grafana/slo/rules.yaml') + stringify(prometheusRule(readFileSync(join(root, 'grafana', 'slo', 'rules.yaml'), 'utf8')), YAML_OPTIONS),
    },
    {
      path: `${MONITORING_GENERATED_DIR}/grafana.yaml`,
      text: header('The Grafana boards and datasource, for the Grafana sidecar (labels grafana_dashboard, grafana_datasource).', 'grafana/dashboards and grafana/provisioning') + grafana.map((o) => stringify(o, YAML_OPTIONS)).join('---\n'),
    },
  ];
}
