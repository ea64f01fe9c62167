import { type EnvoyApi, parseMeshPolicy } from '@infermesh/mesh';
import { parse as parseYaml } from 'yaml';
import { MESH_CONFIG_MAP } from './k8s-files';

/** One object of a rendered manifest. */
export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [field: string]: unknown;
}

/** What is wrong, and with which object (`Deployment/router`). */
export interface Problem {
  object: string;
  message: string;
}

export interface CheckOptions {
  /** Production rules too: three replicas or more, a disruption budget, a zone spread, default-deny network policies. */
  production: boolean;
  envoy: EnvoyApi;
}

/* eslint-disable @typescript-eslint/no-explicit-any, @typescript-eslint/no-unsafe-member-access, @typescript-eslint/no-unsafe-assignment, @typescript-eslint/no-unsafe-argument, @typescript-eslint/no-unsafe-call, @typescript-eslint/no-unsafe-return --
 * A rendered manifest is untyped JSON of many kinds, walked here field by field where each check
 * needs it: every missing field reads as undefined and is reported as a problem, never trusted. */
type Any = any;

const MESH_LABEL = 'app.kubernetes.io/part-of';
const NAME_LABEL = 'app.kubernetes.io/name';
const ZONE = 'topology.kubernetes.io/zone';
const HOST = 'kubernetes.io/hostname';

const idOf = (o: K8sObject) => `${o.kind}/${o.metadata.name}`;
const nsOf = (o: K8sObject) => o.metadata.namespace ?? 'default';

/**
 * The schema module of each API group: kubernetes-models for Kubernetes' own, its companion packages
 * for the custom resources the manifests use (KEDA, cert-manager, the Prometheus Operator).
 */
const SCHEMA_PACKAGES: Readonly<Record<string, string>> = {
  'keda.sh': '@kubernetes-models/keda',
  'cert-manager.io': '@kubernetes-models/cert-manager',
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator',
};

interface ValidationError {
  instancePath?: string;
  message?: string;
}

/** Validates an object against the OpenAPI schema of its apiVersion and kind. */
export function schemaProblems(object: K8sObject): string[] {
  const [group, version] = object.apiVersion.includes('/') ? object.apiVersion.split('/') : ['', object.apiVersion];
  const module = group === '' ? `kubernetes-models/${version}/${object.kind}` : `${SCHEMA_PACKAGES[group!] ?? 'kubernetes-models'}/${group}/${version}/${object.kind}`;
  let Model: (new (data: unknown) => { validate(): void }) | undefined;
  try {
    // The schema packages are CommonJS modules, one per kind: only the kinds the manifest holds are loaded.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    Model = (require(module) as Record<string, new (data: unknown) => { validate(): void }>)[object.kind];
  } catch {
    Model = undefined;
  }
  if (Model === undefined) return [`no schema known for apiVersion ${object.apiVersion}, kind ${object.kind}`];
  try {
    new Model(asDecoded(object)).validate();
    return [];
  } catch (error) {
    const errors = (error as { errors?: ValidationError[] }).errors;
    if (errors === undefined) return [String(error instanceof Error ? error.message : error)];
    return errors.map((e) => `${e.instancePath === '' || e.instancePath === undefined ? '(object)' : e.instancePath} ${e.message ?? 'is invalid'}`);
  }
}

/**
 * The object as the API server decodes it: base64 fields may be wrapped over lines (kustomize wraps
 * a Secret's data at 70 columns; Go's base64 decoder skips line breaks), which the schema's byte
 * format does not allow.
 */
function asDecoded(object: K8sObject): K8sObject {
  if (object.kind !== 'Secret' || typeof object['data'] !== 'object' || object['data'] === null) return object;
  const data = Object.fromEntries(Object.entries(object['data'] as Record<string, unknown>).map(([k, v]) => [k, typeof v === 'string' ? v.replace(/[\r\n]/g, '') : v]));
  return { ...object, data };
}

const workloadKinds = new Set(['Deployment', 'StatefulSet', 'DaemonSet']);

function podSpec(workload: K8sObject): Any {
  return (workload as Any).spec?.template?.spec ?? {};
}

function podLabels(workload: K8sObject): Record<string, string> {
  return (workload as Any).spec?.template?.metadata?.labels ?? {};
}

/** A selector's matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) against labels. */
function selects(selector: Any, labels: Record<string, string>): boolean {
  if (selector === undefined || selector === null) return false;
  const byLabels = Object.entries((selector.matchLabels ?? {}) as Record<string, string>).every(([k, v]) => labels[k] === v);
  const byExpressions = ((selector.matchExpressions ?? []) as Any[]).every((e) => {
    const value = labels[e.key];
    switch (e.operator) {
      case 'In':
        return value !== undefined && (e.values as string[]).includes(value);
      case 'NotIn':
        return value === undefined || !(e.values as string[]).includes(value);
      case 'Exists':
        return value !== undefined;
      case 'DoesNotExist':
        return value === undefined;
      default:
        return false;
    }
  });
  return byLabels && byExpressions;
}

/** Resources, security context and (for the regular containers) probes of each container of a workload. */
function containerProblems(workload: K8sObject): string[] {
  const spec = podSpec(workload);
  const problems: string[] = [];
  const pod = spec.securityContext ?? {};
  const all = [...((spec.initContainers ?? []) as Any[]).map((c) => ({ c, init: true })), ...((spec.containers ?? []) as Any[]).map((c) => ({ c, init: false }))];
  for (const { c, init } of all) {
    const at = `container ${c.name}`;
    const requests = c.resources?.requests ?? {};
    const limits = c.resources?.limits ?? {};
    if (requests.cpu === undefined || requests.memory === undefined) problems.push(`${at}: resources.requests must set cpu and memory`);
    if (limits.memory === undefined) problems.push(`${at}: resources.limits must set memory`);
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false) problems.push(`${at}: securityContext.allowPrivilegeEscalation must be false`);
    if (sc.readOnlyRootFilesystem !== true) problems.push(`${at}: securityContext.readOnlyRootFilesystem must be true`);
    if (!((sc.capabilities?.drop ?? []) as string[]).includes('ALL')) problems.push(`${at}: securityContext.capabilities.drop must include ALL`);
    if ((sc.capabilities?.add ?? []).length > 0) problems.push(`${at}: securityContext.capabilities.add must be empty`);
    if (sc.privileged === true) problems.push(`${at}: securityContext.privileged must not be true`);
    if ((sc.runAsNonRoot ?? pod.runAsNonRoot) !== true) problems.push(`${at}: runAsNonRoot must be true (container or pod securityContext)`);
    if ((sc.seccompProfile?.type ?? pod.seccompProfile?.type) !== 'RuntimeDefault') problems.push(`${at}: seccompProfile.type must be RuntimeDefault (container or pod securityContext)`);
    const names = ((c.env ?? []) as Any[]).map((e) => e.name as string);
    for (const name of new Set(names.filter((n, i) => names.indexOf(n) !== i))) problems.push(`${at}: env ${name} is set twice (the API server keeps the last; server-side apply refuses it)`);
    const sidecar = init && c.restartPolicy === 'Always';
    if (!init || sidecar) {
      if (c.readinessProbe === undefined) problems.push(`${at}: no readinessProbe`);
      if (c.livenessProbe === undefined) problems.push(`${at}: no livenessProbe`);
    }
  }
  return problems;
}

/** A mesh service's own container: native gRPC probes (grpc.health.v1) on a port it declares, and a drain that fits. */
function meshAppProblems(workload: K8sObject): string[] {
  const spec = podSpec(workload);
  const app = (spec.containers ?? [])[0];
  if (app === undefined) return ['no container'];
  const problems: string[] = [];
  const declared = new Set(((app.ports ?? []) as Any[]).map((p) => p.containerPort as number));
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const port = app[probe]?.grpc?.port as number | undefined;
    if (port === undefined) problems.push(`container ${app.name}: ${probe} must be a native gRPC probe (grpc.health.v1)`);
    else if (!declared.has(port)) problems.push(`container ${app.name}: ${probe} probes port ${port}, which the container does not declare`);
  }
  const sleep = (app.lifecycle?.preStop?.sleep?.seconds as number | undefined) ?? 0;
  if (app.lifecycle?.preStop === undefined) problems.push(`container ${app.name}: no preStop hook (the load balancers and the mesh stop sending before the drain)`);
  const service = podLabels(workload)[NAME_LABEL] ?? '';
  const graceVar = `${service.toUpperCase()}_SHUTDOWN_GRACE_MS`;
  const graceMs = Number(((app.env ?? []) as Any[]).find((e) => e.name === graceVar)?.value ?? 10_000);
  const period = (spec.terminationGracePeriodSeconds as number | undefined) ?? 30;
  if (period < sleep + graceMs / 1000) {
    problems.push(`terminationGracePeriodSeconds ${period} is shorter than the preStop sleep (${sleep} s) and the drain (${graceVar} ${graceMs} ms)`);
  }
  return problems;
}

/** The bootstrap file a sidecar runs, with the pod's labels put in place of $(INFERMESH_SERVICE). */
function sidecarConfig(workload: K8sObject): { sidecar: Any; file: string | undefined; mount: Any } | undefined {
  const spec = podSpec(workload);
  const sidecar = ((spec.initContainers ?? []) as Any[]).find((c) => c.name === 'envoy' && c.restartPolicy === 'Always');
  if (sidecar === undefined) return undefined;
  const args = (sidecar.args ?? []) as string[];
  const at = args.findIndex((a) => a === '--config-path' || a === '-c');
  const path = at >= 0 ? args[at + 1] : undefined;
  const file = path?.replace('$(INFERMESH_SERVICE)', podLabels(workload)[NAME_LABEL] ?? '');
  const dir = file === undefined ? undefined : file.slice(0, file.lastIndexOf('/'));
  const mount = ((sidecar.volumeMounts ?? []) as Any[]).find((m) => m.mountPath === dir);
  return { sidecar, file, mount };
}

/** The hosts and ports of every cluster of a bootstrap that are not in the pod (127.0.0.1, localhost). */
function remoteAddresses(bootstrap: Any): { cluster: string; host: string; port: number }[] {
  const found: { cluster: string; host: string; port: number }[] = [];
  for (const cluster of (bootstrap?.static_resources?.clusters ?? []) as Any[]) {
    for (const group of (cluster.load_assignment?.endpoints ?? []) as Any[]) {
      for (const lb of (group.lb_endpoints ?? []) as Any[]) {
        const socket = lb.endpoint?.address?.socket_address;
        if (socket === undefined || socket.address === '127.0.0.1' || socket.address === 'localhost') continue;
        found.push({ cluster: cluster.name as string, host: socket.address as string, port: socket.port_value as number });
      }
    }
  }
  return found;
}

/** The sidecar of a mesh workload: present, its bootstrap in the mounted ConfigMap, passing Envoy's check, its upstreams existing Services. */
function sidecarProblems(workload: K8sObject, objects: K8sObject[], envoy: EnvoyApi, checked: Map<string, string[]>): string[] {
  const config = sidecarConfig(workload);
  if (config === undefined) return ['no Envoy sidecar (an init container named envoy with restartPolicy Always)'];
  if (config.file === undefined) return ['the Envoy sidecar names no --config-path'];
  if (config.mount === undefined) return [`the Envoy sidecar mounts no volume at the folder of ${config.file}`];
  const volume = ((podSpec(workload).volumes ?? []) as Any[]).find((v) => v.name === config.mount.name);
  const mapName = volume?.configMap?.name as string | undefined;
  const configMap = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === mapName && nsOf(o) === nsOf(workload));
  if (configMap === undefined) return [`the Envoy sidecar's volume ${config.mount.name} is not a ConfigMap of this manifest`];
  const fileName = config.file.slice(config.file.lastIndexOf('/') + 1);
  const text = (configMap as Any).data?.[fileName] as string | undefined;
  if (text === undefined) return [`ConfigMap/${mapName} has no ${fileName}, the Envoy sidecar's bootstrap`];
  const key = `${mapName}/${fileName}`;
  if (!checked.has(key)) {
    const bootstrap = parseYaml(text);
    const problems = envoy.checkBootstrap(bootstrap).map((p) => `${fileName} fails Envoy's API check: ${p}`);
    for (const { cluster, host, port } of remoteAddresses(bootstrap)) {
      const service = serviceByHost(objects, host);
      if (service === undefined) problems.push(`${fileName}: cluster ${cluster} dials ${host}, which names no Service of this manifest`);
      else if (!((service as Any).spec?.ports ?? []).some((p: Any) => p.port === port)) problems.push(`${fileName}: cluster ${cluster} dials ${host}:${port}, but Service/${service.metadata.name} has no port ${port}`);
    }
    checked.set(key, problems);
  }
  return checked.get(key)!;
}

/** The Service a cluster-local DNS name (<name>.<namespace>.svc[.<domain>]) names. */
function serviceByHost(objects: K8sObject[], host: string): K8sObject | undefined {
  const [name, namespace, svc] = host.split('.');
  if (svc !== 'svc') return undefined;
  return objects.find((o) => o.kind === 'Service' && o.metadata.name === name && nsOf(o) === namespace);
}

/** Every Service selects pods of the manifest, and each of its ports targets a port those pods declare. */
function serviceProblems(service: K8sObject, workloads: K8sObject[]): string[] {
  const selector = (service as Any).spec?.selector as Record<string, string> | undefined;
  if ((service as Any).spec?.type === 'ExternalName') return [];
  // A Service's selector is a label map (an empty one selects nothing here: its endpoints are set by hand).
  const pods = selector === undefined || Object.keys(selector).length === 0 ? [] : workloads.filter((w) => nsOf(w) === nsOf(service) && selects({ matchLabels: selector }, podLabels(w)));
  if (pods.length === 0) return [`selects no pods of this manifest (selector ${JSON.stringify(selector ?? {})})`];
  const problems: string[] = [];
  for (const port of ((service as Any).spec?.ports ?? []) as Any[]) {
    const target = port.targetPort ?? port.port;
    for (const pod of pods) {
      const spec = podSpec(pod);
      const declared = [...((spec.containers ?? []) as Any[]), ...((spec.initContainers ?? []) as Any[])].flatMap((c) => (c.ports ?? []) as Any[]);
      const found = typeof target === 'string' ? declared.some((p) => p.name === target) : declared.some((p) => p.containerPort === target);
      if (!found) problems.push(`port ${port.name ?? port.port} targets ${target}, which no container of ${idOf(pod)} declares`);
    }
  }
  return problems;
}

/** Production: replicas, a disruption budget, a spread over zones and hosts. */
function productionWorkloadProblems(workload: K8sObject, objects: K8sObject[]): string[] {
  const problems: string[] = [];
  const labels = podLabels(workload);
  // An autoscaled tier's floor is its autoscaler's (its Deployment leaves replicas to it, or each apply would reset them).
  const scaler = objects.find((o) => (o.kind === 'ScaledObject' || o.kind === 'HorizontalPodAutoscaler') && nsOf(o) === nsOf(workload) && (o as Any).spec?.scaleTargetRef?.name === workload.metadata.name) as Any;
  const replicas = scaler === undefined ? (((workload as Any).spec?.replicas as number | undefined) ?? 1) : ((scaler.spec.minReplicaCount ?? scaler.spec.minReplicas ?? 1) as number);
  if (replicas < 3) problems.push(`${scaler === undefined ? 'replicas' : `${scaler.kind as string} minimum`} ${replicas}: production runs at least 3 per tier`);
  if (scaler !== undefined && (workload as Any).spec?.replicas !== undefined) problems.push(`sets replicas though ${scaler.kind as string}/${scaler.metadata.name as string} scales it: each apply would reset the count`);
  if (!objects.some((o) => o.kind === 'PodDisruptionBudget' && nsOf(o) === nsOf(workload) && selects((o as Any).spec?.selector, labels))) problems.push('no PodDisruptionBudget selects its pods');
  const spread = ((podSpec(workload).topologySpreadConstraints ?? []) as Any[]).filter((t) => selects(t.labelSelector, labels));
  if (!spread.some((t) => t.topologyKey === ZONE)) problems.push(`no topologySpreadConstraints over ${ZONE} that selects its pods`);
  if (!spread.some((t) => t.topologyKey === HOST)) problems.push(`no topologySpreadConstraints over ${HOST} that selects its pods`);
  return problems;
}

/** The mesh workload's identity: its ServiceAccount is named as its service (the SPIFFE ID's path) and exists. */
function identityProblems(workload: K8sObject, objects: K8sObject[]): string[] {
  const account = podSpec(workload).serviceAccountName as string | undefined;
  const service = podLabels(workload)[NAME_LABEL];
  if (account !== service) return [`serviceAccountName ${account ?? '(none)'} must be ${service}: the mesh identity is spiffe://<trust domain>/<service account>`];
  if (!objects.some((o) => o.kind === 'ServiceAccount' && o.metadata.name === account && nsOf(o) === nsOf(workload))) return [`ServiceAccount ${account} is not in this manifest`];
  return [];
}

/** The metric names the autoscalers read (KEDA Prometheus triggers, HPA external and pod metrics). */
export function autoscalerMetrics(objects: K8sObject[]): { object: string; metric: string }[] {
  const found: { object: string; metric: string }[] = [];
  for (const o of objects) {
    if (o.kind === 'ScaledObject') {
      for (const trigger of ((o as Any).spec?.triggers ?? []) as Any[]) {
        if (trigger.type !== 'prometheus') continue;
        for (const metric of new Set((String(trigger.metadata?.query ?? '').match(/\binfermesh_[a-z0-9_]+/g) ?? []))) found.push({ object: idOf(o), metric });
      }
    }
    if (o.kind === 'HorizontalPodAutoscaler') {
      for (const m of ((o as Any).spec?.metrics ?? []) as Any[]) {
        const name = m.external?.metric?.name ?? m.pods?.metric?.name;
        if (typeof name === 'string') found.push({ object: idOf(o), metric: name });
      }
    }
  }
  return found;
}

/** Each autoscaler targets a workload of the manifest. */
function autoscalerProblems(scaler: K8sObject, workloads: K8sObject[]): string[] {
  const target = (scaler as Any).spec?.scaleTargetRef?.name as string | undefined;
  return workloads.some((w) => w.metadata.name === target && nsOf(w) === nsOf(scaler)) ? [] : [`scaleTargetRef ${target ?? '(none)'} names no workload of this manifest`];
}

/** The namespace the mesh policy's DNS names use is the one the services are in. */
function policyProblems(configMap: K8sObject, workloads: K8sObject[]): string[] {
  const text = (configMap as Any).data?.['mesh.yaml'] as string | undefined;
  if (text === undefined) return ['has no mesh.yaml (the policy the registry serves)'];
  const policy = parseMeshPolicy(text, 'mesh.yaml');
  const mesh = workloads.filter((w) => (w.metadata.labels ?? {})[MESH_LABEL] === 'infermesh');
  const problems = mesh.filter((w) => nsOf(w) !== policy.kubernetes.namespace).map((w) => `mesh.yaml names namespace ${policy.kubernetes.namespace}, but ${idOf(w)} is in ${nsOf(w)}`);
  // Every service announces itself to the registry through its sidecar, which needs the edge for it.
  for (const service of new Set(mesh.map((w) => podLabels(w)[NAME_LABEL]))) {
    if (service === undefined || service === 'registry') continue;
    if (!policy.edges.some((e) => e.from === service && e.to === 'registry')) problems.push(`mesh.yaml has no edge from ${service} to registry: ${service}'s sidecar would have no listener for the control plane it announces itself to`);
  }
  return problems;
}

/** Every check of a rendered manifest; an empty list when it passes. */
export function checkManifests(objects: K8sObject[], options: CheckOptions): Problem[] {
  const problems: Problem[] = [];
  const add = (o: K8sObject, messages: string[]) => problems.push(...messages.map((message) => ({ object: idOf(o), message })));
  const workloads = objects.filter((o) => workloadKinds.has(o.kind));
  const checkedBootstraps = new Map<string, string[]>();
  for (const o of objects) {
    add(o, schemaProblems(o));
    if (workloadKinds.has(o.kind)) {
      add(o, containerProblems(o));
      if ((o.metadata.labels ?? {})[MESH_LABEL] === 'infermesh') {
        add(o, meshAppProblems(o));
        add(o, sidecarProblems(o, objects, options.envoy, checkedBootstraps));
        add(o, identityProblems(o, objects));
        if (options.production) add(o, productionWorkloadProblems(o, objects));
      }
    }
    if (o.kind === 'Service') add(o, serviceProblems(o, workloads));
    if (o.kind === 'ScaledObject' || o.kind === 'HorizontalPodAutoscaler') add(o, autoscalerProblems(o, workloads));
    if (o.kind === 'ConfigMap' && o.metadata.name === MESH_CONFIG_MAP) add(o, policyProblems(o, workloads));
  }
  if (options.production) {
    const namespaces = new Set(workloads.map(nsOf));
    for (const namespace of namespaces) {
      const denies = objects.some((o) => o.kind === 'NetworkPolicy' && nsOf(o) === namespace && Object.keys((o as Any).spec?.podSelector ?? {}).length === 0 && ['Ingress', 'Egress'].every((t) => ((o as Any).spec?.policyTypes ?? []).includes(t)) && ((o as Any).spec?.ingress ?? []).length === 0 && ((o as Any).spec?.egress ?? []).length === 0);
      if (!denies) problems.push({ object: `Namespace/${namespace}`, message: 'no NetworkPolicy denies ingress and egress by default (podSelector {}, both policyTypes, no rules)' });
    }
  }
  return problems;
}
