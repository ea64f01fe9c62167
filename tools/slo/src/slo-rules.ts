import { MESH_SERVICES } from '@infermesh/mesh';
import { UNKNOWN_LABEL } from '@infermesh/telemetry';
import {
  BURN_RATE_ALERTS,
  burnRate,
  errorBudget,
  promDuration,
  round,
  type Severity,
  SLI_WINDOWS,
  type Slo,
  type SloSpec,
  alertNameOf,
} from './slo-spec';

/**
 * Compiles an SLO spec into Prometheus rule groups: the SLIs recorded over every alert window, the
 * multiwindow, multi-burn-rate alerts of each objective, and the operational alerts.
 */

/** Inference requests by model, version and outcome, counted by the gateway once per request. */
export const GATEWAY_INFERENCES = 'infermesh_gateway_inference_requests_total';
/** Public API requests by protocol, endpoint and code, timed by the gateway: has no model label. */
export const GATEWAY_DURATION = 'infermesh_gateway_request_duration_seconds';
/** Successful inference requests by model, the version that served them and cached, timed by the router from arrival to answer. */
export const ROUTER_DURATION = 'infermesh_router_request_duration_seconds';
/** The gateway's `endpoint` values of inference: the gRPC method and the REST route templates. */
export const INFERENCE_ENDPOINTS = [
  'ModelInfer',
  'POST /v2/models/:model/infer',
  'POST /v2/models/:model/versions/:version/infer',
] as const;
/** The gateway's `code` values of a successful request: gRPC and REST. */
export const SUCCESS_CODES = ['OK', '200'] as const;
/** The model label of inferences the gateway refused before routing them (services/gateway). */
export const NOT_ROUTED = '(not routed)';
/** Model label values that name no model: left to the `all` objectives. */
export const PSEUDO_MODELS = [UNKNOWN_LABEL, NOT_ROUTED] as const;

export const GROUPS = {
  availability: 'infermesh-slo-sli-availability',
  latency: 'infermesh-slo-sli-latency',
  slo: 'infermesh-slo-alerts',
  operations: 'infermesh-operations',
} as const;

export interface RecordingRule {
  record: string;
  expr: string;
  labels?: Record<string, string>;
}

export interface Annotations {
  summary: string;
  description: string;
  runbook: string;
}

export interface AlertingRule {
  alert: string;
  expr: string;
  for?: string;
  labels: Record<string, string> & { severity: Severity };
  annotations: Annotations;
}

export interface RuleGroup {
  name: string;
  rules: (RecordingRule | AlertingRule)[];
}

/** A PromQL string literal. */
export function promString(text: string): string {
  return `"${text.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;
}

/** A regular expression matching exactly these strings. */
export function alternatives(values: readonly string[]): string {
  return values.map((v) => v.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|');
}

/** A threshold in seconds as Prometheus (and prom-client) write a bucket's `le`. */
export function le(seconds: number): string {
  return String(seconds);
}

const prettyPercent = (ratio: number) => `${round(ratio * 100)} %`;
const ms = (seconds: number) => round(seconds * 1000);

/** The name of a recorded SLI: `<level>:<what>:ratio_rate<window>`. */
export function sliRecord(sli: Slo['sli'], perModel: boolean, window: string): string {
  const what = sli === 'availability' ? 'inference_errors' : 'inference_slow';
  return perModel ? `model:infermesh_${what}:ratio_rate${window}` : `infermesh:${what}:ratio_rate${window}`;
}

function availabilityRule(errorOutcomes: readonly string[], perModel: boolean, window: string): RecordingRule {
  const by = perModel ? 'sum by (model) ' : 'sum';
  const total = `${by}(rate(${GATEWAY_INFERENCES}[${window}]))`;
  return {
    record: sliRecord('availability', perModel, window),
    // The error series appear with their first error: `or … * 0` makes the ratio 0, not absent, while there are none.
    expr: [
      `(`,
      `  ${by}(rate(${GATEWAY_INFERENCES}{outcome=~${promString(alternatives(errorOutcomes))}}[${window}]))`,
      `or`,
      `  ${total} * 0`,
      `)`,
      `/`,
      `${total}`,
    ].join('\n'),
  };
}

function latencyRule(threshold: number, perModel: boolean, window: string): RecordingRule {
  const [metric, by, filter] = perModel
    ? [ROUTER_DURATION, 'sum by (model) ', '']
    : [
        GATEWAY_DURATION,
        'sum',
        `endpoint=~${promString(alternatives(INFERENCE_ENDPOINTS))},code=~${promString(alternatives(SUCCESS_CODES))}`,
      ];
  const bucketFilter = filter === '' ? `le="${le(threshold)}"` : `${filter},le="${le(threshold)}"`;
  return {
    record: sliRecord('latency', perModel, window),
    expr: [
      `1 - (`,
      `  ${by}(rate(${metric}_bucket{${bucketFilter}}[${window}]))`,
      `/`,
      `  ${by}(rate(${metric}_count${filter === '' ? '' : `{${filter}}`}[${window}]))`,
      `)`,
    ].join('\n'),
    labels: { threshold: le(threshold) },
  };
}

/** The series of an objective's SLI over a window, as its alerts select it. */
export function sliSelector(slo: Slo, window: string): string {
  const matchers: string[] = [];
  if (slo.sli === 'latency') matchers.push(`threshold="${le(slo.target.threshold)}"`);
  if (slo.scope.kind === 'model') matchers.push(`model=${promString(slo.scope.model)}`);
  if (slo.scope.kind === 'eachModel')
    matchers.push(`model!~${promString(alternatives([...slo.scope.except, ...PSEUDO_MODELS]))}`);
  return `${sliRecord(slo.sli, slo.scope.kind !== 'all', window)}${matchers.length === 0 ? '' : `{${matchers.join(',')}}`}`;
}

/** The burn-rate conditions of one severity: both windows over the rate, for each pair. */
export function burnConditions(
  slo: Slo,
  severity: Severity,
): { longWindow: string; shortWindow: string; rate: number; budgetShare: number }[] {
  return BURN_RATE_ALERTS.filter((a) => a.severity === severity).map((a) => ({
    longWindow: a.longWindow,
    shortWindow: a.shortWindow,
    rate: burnRate(slo.windowMs, a),
    budgetShare: a.budgetShare,
  }));
}

function burnExpr(slo: Slo, severity: Severity): string {
  const budget = errorBudget(slo.target.objective);
  return burnConditions(slo, severity)
    .map(({ longWindow, shortWindow, rate }) =>
      [
        `(`,
        `  ${sliSelector(slo, longWindow)} > (${rate} * ${budget})`,
        `and`,
        `  ${sliSelector(slo, shortWindow)} > (${rate} * ${budget})`,
        `)`,
      ].join('\n'),
    )
    .join('\nor\n');
}

/** The alert name of an objective's burn-rate alerts (page and ticket share it; `severity` tells them apart). */
export function burnAlertName(slo: Slo): string {
  return `${alertNameOf(slo.scope)}${slo.sli === 'availability' ? 'Availability' : 'Latency'}BudgetBurn`;
}

function burnAlert(slo: Slo, severity: Severity, errorOutcomes: readonly string[]): AlertingRule {
  const window = promDuration(slo.windowMs);
  const whose = slo.scope.kind === 'all' ? 'all models' : 'model {{ $labels.model }}';
  const conditions = burnConditions(slo, severity)
    .map(
      (c) =>
        `${c.rate}× the budget rate over ${c.longWindow} and ${c.shortWindow} (${prettyPercent(c.budgetShare)} of the ${window} budget gone in ${c.longWindow})`,
    )
    .join(', or ');
  const speed = severity === 'page' ? 'fast' : 'steadily';
  const annotations: Annotations =
    slo.sli === 'availability'
      ? {
          summary: `Server-side errors of ${whose} burn the ${slo.target.objective} % availability budget ${speed}`,
          description:
            `The error budget of ${whose} (${prettyPercent(errorBudget(slo.target.objective))} of the inference requests over ${window} may fail with ` +
            `${errorOutcomes.join(', ')}) is burning ${speed}: ${conditions}. Source: ${GATEWAY_INFERENCES} by outcome.`,
          runbook:
            `See which outcome grows: sum by (model, outcome) (rate(${GATEWAY_INFERENCES}[5m])). unavailable: workers reachable, circuits open, ` +
            'a rollout to roll back; deadline_exceeded or resource_exhausted: queue depth and worker capacity (add workers); overloaded: ' +
            "the gateway's concurrency limit (infermesh_gateway_concurrency_limit), more workers or more gateways; internal: the logs of the router and workers.",
        }
      : {
          summary: `Slow inference requests of ${whose} burn the budget of ${slo.target.objective} % under ${ms(slo.target.threshold)} ms ${speed}`,
          description:
            `The latency budget of ${whose} (${prettyPercent(errorBudget(slo.target.objective))} of the successful inference requests over ${window} may take ` +
            `over ${ms(slo.target.threshold)} ms) is burning ${speed}: ${conditions}. Source: ` +
            (slo.scope.kind === 'all'
              ? `${GATEWAY_DURATION} (inference endpoints, successful codes).`
              : `${ROUTER_DURATION} (from the router's arrival to its answer: the gateway's own time is not in it).`),
          runbook:
            'Find where the time goes: infermesh_batcher_queue_time_seconds (queueing: add workers or lower the max queue delay), ' +
            'infermesh_batcher_dispatch_duration_seconds (a slow version: roll back a recent rollout), the cache hit ratio ' +
            '(infermesh_router_cache_requests_total), model loads on demand (infermesh_worker_model_load_duration_seconds).',
        };
  return {
    alert: burnAlertName(slo),
    expr: burnExpr(slo, severity),
    labels: { severity, slo: slo.id, sli: slo.sli },
    annotations,
  };
}

/** The Prometheus job of a service. */
export function jobOf(spec: SloSpec, service: string): string {
  return `${spec.alerts.jobPrefix}${service}`;
}

/** The services whose followers of the registry export registry_watch_* (libs/registry-watch). */
export const REGISTRY_FOLLOWERS = ['router', 'batcher', 'worker'] as const;

/** The operational alerts, by name, from the services' own metrics. */
export function operationalAlerts(spec: SloSpec): AlertingRule[] {
  const a = spec.alerts;
  const jobs = MESH_SERVICES.map((s) => jobOf(spec, s));
  const queueDepth = Math.ceil((a.queueNearBound.bound * a.queueNearBound.percent) / 100);
  return [
    {
      alert: 'InfermeshServiceDown',
      expr: [
        `max by (job) (up{job=~${promString(alternatives(jobs))}}) == 0`,
        ...jobs.map((job) => `or absent(up{job=${promString(job)}})`),
      ].join('\n'),
      for: promDuration(a.serviceDown.forMs),
      labels: { severity: 'page' },
      annotations: {
        summary: '{{ $labels.job }} is down',
        description: `No instance of {{ $labels.job }} has answered Prometheus' scrapes for ${promDuration(a.serviceDown.forMs)} (up == 0), or Prometheus has no target for it.`,
        runbook:
          "Look at the service's processes or pods and their last logs (a crash loop, a configuration refused at start-up, certificates), " +
          `restart it; if it runs, check that Prometheus scrapes its metrics port as job ${jobOf(spec, '<service>')}.`,
      },
    },
    {
      alert: 'InfermeshBatcherNoWorkerReachable',
      expr: 'infermesh_batcher_workers_reachable == 0',
      for: promDuration(a.noWorkerReachable.forMs),
      labels: { severity: 'page' },
      annotations: {
        summary: 'Batcher {{ $labels.instance }} reaches no worker',
        description: `No worker answered the polls of batcher {{ $labels.instance }} for ${promDuration(a.noWorkerReachable.forMs)}: every request it queues fails UNAVAILABLE (the fallback models too).`,
        runbook:
          'Check that workers run and are SERVING (their /health), that BATCHER_WORKER_ADDRESSES (or the mesh control plane) lists them, ' +
          'and the batcher → worker edge (mTLS certificates, authorization); start or add workers.',
      },
    },
    {
      alert: 'InfermeshBatcherQueueNearBound',
      expr: `infermesh_batcher_queue_depth >= ${queueDepth}`,
      for: promDuration(a.queueNearBound.forMs),
      labels: { severity: 'ticket' },
      annotations: {
        summary: 'The queue of model {{ $labels.model }} version {{ $labels.version }} is near its bound',
        description:
          `Batcher {{ $labels.instance }} has held ${queueDepth} or more requests of model {{ $labels.model }} version {{ $labels.version }} for ` +
          `${promDuration(a.queueNearBound.forMs)}: ${a.queueNearBound.percent} % of the queue bound of ${a.queueNearBound.bound} (BATCHER_DEFAULT_MAX_QUEUE_SIZE); ` +
          'a full queue refuses requests (RESOURCE_EXHAUSTED, QUEUE_FULL).',
        runbook:
          'Add workers that place this model (WORKER_MODELS) or batchers; check its batch time (infermesh_batcher_dispatch_duration_seconds) ' +
          "for a slow version to roll back; raise the version's maxQueueSize only if its latency objective allows the wait.",
      },
    },
    {
      alert: 'InfermeshBatcherQueueFull',
      expr: 'sum by (job, instance, model) (rate(infermesh_batcher_rejections_total{reason="QUEUE_FULL"}[5m])) > 0',
      for: promDuration(a.queueFull.forMs),
      labels: { severity: 'ticket' },
      annotations: {
        summary: 'The queue of model {{ $labels.model }} is full and refuses requests',
        description:
          `Batcher {{ $labels.instance }} has refused requests of model {{ $labels.model }} because its queue was full (QUEUE_FULL) for ${promDuration(a.queueFull.forMs)}: ` +
          'clients get RESOURCE_EXHAUSTED unless its fallback model answers (degraded).',
        runbook:
          'Add workers that place this model (WORKER_MODELS) or batchers; look for a slow version (infermesh_batcher_dispatch_duration_seconds) ' +
          'and roll it back; rate-limit the clients that flood it (GATEWAY_RATE_LIMIT_*).',
      },
    },
    {
      alert: 'InfermeshRouterCircuitOpen',
      expr: 'max by (model, version) (infermesh_router_circuit_state) >= 1',
      for: promDuration(a.circuitOpen.forMs),
      labels: { severity: 'ticket' },
      annotations: {
        summary:
          'The circuit of model {{ $labels.model }} version {{ $labels.version }} has not closed for ' +
          promDuration(a.circuitOpen.forMs),
        description:
          `A router has held the circuit of model {{ $labels.model }} version {{ $labels.version }} open or half-open for ${promDuration(a.circuitOpen.forMs)}: ` +
          'the version keeps failing (UNAVAILABLE, INTERNAL or timeouts on generous deadlines); its requests fail, or its fallback model answers them degraded.',
        runbook:
          'Look at why the version fails (infermesh_batcher_dispatched_total by outcome, worker logs, infermesh_worker_model_loads_total); ' +
          'roll back to the previous version (infermesh rollout rollback) or fix its workers.',
      },
    },
    {
      alert: 'InfermeshRegistryWatchDisconnected',
      expr: `{__name__=~${promString(`infermesh_(${REGISTRY_FOLLOWERS.join('|')})_registry_watch_config_age_seconds`)}} >= ${a.registryWatchDisconnected.afterMs / 1000}`,
      labels: { severity: 'ticket' },
      annotations: {
        summary:
          '{{ $labels.job }} {{ $labels.instance }} has not heard the registry for ' +
          promDuration(a.registryWatchDisconnected.afterMs),
        description:
          `The registry watch stream of {{ $labels.job }} {{ $labels.instance }} has been closed for ${promDuration(a.registryWatchDisconnected.afterMs)} or more ` +
          '(registry_watch_config_age_seconds): it serves its last configuration, and misses new versions, rollouts and retirements.',
        runbook:
          "Check the registry (its /health and logs) and the edge to it (address, mTLS certificates, authorization); the service's /health " +
          'shows the registry section with last_error.',
      },
    },
    {
      alert: 'InfermeshWorkerMemoryBudgetExhausted',
      expr:
        'sum by (job, instance) (infermesh_worker_models_loaded_bytes)\n/\nsum by (job, instance) (infermesh_worker_memory_budget_bytes)\n' +
        `>= ${round(a.workerMemoryBudget.percent / 100)}`,
      for: promDuration(a.workerMemoryBudget.forMs),
      labels: { severity: 'ticket' },
      annotations: {
        summary: 'Worker {{ $labels.instance }} has used its model memory budget',
        description:
          `The model versions loaded on worker {{ $labels.instance }} have been charged ${a.workerMemoryBudget.percent} % or more of WORKER_MEMORY_BUDGET_BYTES for ` +
          `${promDuration(a.workerMemoryBudget.forMs)}: loading another version evicts idle ones (cold loads) or, when they are pinned or busy, ` +
          'fails with RESOURCE_EXHAUSTED (infermesh_worker_model_loads_total{outcome="no_room"}).',
        runbook:
          'Raise WORKER_MEMORY_BUDGET_BYTES if the machine has the memory, add workers and split the models between them (WORKER_MODELS), ' +
          'unpin models (WORKER_PINNED_MODELS), or retire unused versions.',
      },
    },
  ];
}

/** Every rule group of the spec, in evaluation order: recorded SLIs first, then the alerts that read them. */
export function sloRuleGroups(spec: SloSpec): RuleGroup[] {
  const latencyThresholds = (perModel: boolean) =>
    [
      ...new Set(
        spec.slos.flatMap((s) =>
          s.sli === 'latency' && (s.scope.kind !== 'all') === perModel ? [s.target.threshold] : [],
        ),
      ),
    ].sort((a, b) => a - b);
  const hasAvailability = spec.slos.some((s) => s.sli === 'availability');
  const groups: RuleGroup[] = [
    {
      name: GROUPS.availability,
      rules: hasAvailability
        ? [false, true].flatMap((perModel) => SLI_WINDOWS.map((w) => availabilityRule(spec.errorOutcomes, perModel, w)))
        : [],
    },
    {
      name: GROUPS.latency,
      rules: [false, true].flatMap((perModel) =>
        latencyThresholds(perModel).flatMap((t) => SLI_WINDOWS.map((w) => latencyRule(t, perModel, w))),
      ),
    },
    {
      name: GROUPS.slo,
      rules: spec.slos.flatMap((slo) =>
        (['page', 'ticket'] as const).map((severity) => burnAlert(slo, severity, spec.errorOutcomes)),
      ),
    },
    { name: GROUPS.operations, rules: operationalAlerts(spec) },
  ];
  return groups.filter((g) => g.rules.length > 0);
}
