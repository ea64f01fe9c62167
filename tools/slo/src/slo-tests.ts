import { LATENCY_BUCKETS_SECONDS } from '@infermesh/telemetry';
import {
  type AlertingRule,
  burnAlertName,
  burnConditions,
  jobOf,
  le,
  NOT_ROUTED,
  operationalAlerts,
  PSEUDO_MODELS,
  type RuleGroup,
  GATEWAY_DURATION,
  GATEWAY_INFERENCES,
  ROUTER_DURATION,
} from './slo-rules';
import {
  errorBudget,
  FAILURE_OUTCOMES,
  parseDurationMs,
  promDuration,
  round,
  type Severity,
  type Slo,
  type SloSpec,
} from './slo-spec';

/**
 * promtool unit tests of the rules (`promtool test rules`), derived from the spec: for every
 * burn-rate condition of every objective, traffic whose error ratio is just over its threshold
 * (the alert fires), just under it (it does not), and over it in the long window but already back
 * to normal in the short one (it does not: the short window resets the alert); for every
 * operational alert, a series at its threshold and one just below it.
 */

export interface InputSeries {
  series: string;
  values: string;
}
export interface ExpectedAlert {
  exp_labels: Record<string, string>;
  exp_annotations: Record<string, string>;
}
export interface AlertRuleTest {
  eval_time: string;
  alertname: string;
  exp_alerts: ExpectedAlert[];
}
export interface TestGroup {
  name: string;
  interval: string;
  input_series: InputSeries[];
  alert_rule_test: AlertRuleTest[];
}
export interface TestFile {
  rule_files: string[];
  evaluation_interval: string;
  group_eval_order: string[];
  tests: TestGroup[];
}

/** Scenarios end here: past the longest window (3d) with an hour of history before it. */
const EVAL_MINUTES = 73 * 60;
/** Requests a minute during a scenario's burst; the traffic before it is twice that, without errors. */
const RATE = 1_000;
/** How far over and under a threshold the error ratio of the fires / just-below scenarios is. */
export const THRESHOLD_MARGIN = 0.001;
/** The error ratio of a recovered scenario, relative to the threshold (its long window stays over it). */
const RECOVERED_FACTOR = 1.3;
/** Each failure outcome that is not an error gets this share of the traffic: counting one as an error would fire every just-below test. */
const NOISE_SHARE = 0.01;

/** A stretch of a scenario: so many minutes with so many requests, and bad ones (errors, or slow), a minute. */
interface Segment {
  minutes: number;
  total: number;
  bad: number;
}

interface Scenario {
  name: string;
  segments: Segment[];
  /** The severity whose alert fires at the end, or undefined. */
  fires: Severity | undefined;
}

/** The values of a counter that grows by `inc(segment)` each minute, from 0 at minute 0, in promtool's notation. */
function counter(segments: readonly Segment[], inc: (s: Segment) => number): string {
  const parts: string[] = [];
  let value = 0;
  segments.forEach((segment, i) => {
    const step = round(inc(segment));
    if (step < 0)
      throw new Error(
        `a test series would decrease (${step} a minute): the objective leaves too little room for the generated traffic`,
      );
    const first = i === 0 ? 0 : round(value + step);
    const times = i === 0 ? segment.minutes : segment.minutes - 1;
    parts.push(`${first}+${step}x${times}`);
    value = round(value + step * segment.minutes);
  });
  return parts.join(' ');
}

function series(name: string, labels: Record<string, string>): string {
  return `${name}{${Object.entries(labels)
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
    .join(',')}}`;
}

/** Each service's metrics port on one machine (README: 8002 for the gateway, 9101 to 9105 for the others). */
const METRICS_PORTS: Readonly<Record<string, number>> = {
  gateway: 8002,
  registry: 9101,
  router: 9102,
  cache: 9103,
  batcher: 9104,
  worker: 9105,
};
const instanceOf = (service: string, n?: number) =>
  `${service}${n === undefined ? '' : `-${n}`}:${METRICS_PORTS[service]}`;

/** The inference counters of the gateway for one model's traffic. */
function availabilitySeries(
  spec: SloSpec,
  model: string,
  segments: readonly Segment[],
  allModels: boolean,
): InputSeries[] {
  const base = { job: jobOf(spec, 'gateway'), instance: instanceOf('gateway') };
  // `overloaded` never carries a model: the gateway refused the request before routing it.
  const modelErrors = spec.errorOutcomes.filter((o) => o !== 'overloaded');
  const errors = allModels || modelErrors.length === 0 ? spec.errorOutcomes : modelErrors;
  const noise = FAILURE_OUTCOMES.filter((o) => !spec.errorOutcomes.includes(o));
  const rest = (s: Segment) => s.total - s.bad - noise.length * NOISE_SHARE * s.total;
  const shares = { ok: 0.8, cached: 0.15, degraded: 0.05 };
  return [
    ...errors.map((outcome) => ({
      series: series(GATEWAY_INFERENCES, {
        ...base,
        model: outcome === 'overloaded' ? NOT_ROUTED : model,
        version: outcome === 'overloaded' ? '' : '1',
        outcome,
      }),
      values: counter(segments, (s) => s.bad / errors.length),
    })),
    ...noise.map((outcome) => ({
      series: series(GATEWAY_INFERENCES, { ...base, model, version: '1', outcome }),
      values: counter(segments, (s) => NOISE_SHARE * s.total),
    })),
    ...Object.entries(shares).map(([outcome, share]) => ({
      series: series(GATEWAY_INFERENCES, { ...base, model, version: '1', outcome }),
      values: counter(segments, (s) => share * rest(s)),
    })),
  ];
}

/** A histogram's count and its buckets at the threshold and either side of it (a rule reading the wrong bucket then fails the tests). */
function histogramSeries(
  name: string,
  labels: Record<string, string>,
  threshold: number,
  segments: readonly Segment[],
  count: (s: Segment) => number,
  fast: (s: Segment) => number,
): InputSeries[] {
  const at = LATENCY_BUCKETS_SECONDS.indexOf(threshold);
  const below = LATENCY_BUCKETS_SECONDS[at - 1];
  const above = LATENCY_BUCKETS_SECONDS[at + 1];
  return [
    { series: series(`${name}_count`, labels), values: counter(segments, count) },
    { series: series(`${name}_bucket`, { ...labels, le: le(threshold) }), values: counter(segments, fast) },
    ...(below === undefined
      ? []
      : [
          {
            series: series(`${name}_bucket`, { ...labels, le: le(below) }),
            values: counter(segments, (s) => fast(s) / 2),
          },
        ]),
    ...(above === undefined
      ? []
      : [{ series: series(`${name}_bucket`, { ...labels, le: le(above) }), values: counter(segments, count) }]),
  ];
}

/** Successful inference requests timed by the router (per model) or the gateway (all): `bad` of them slower than the threshold. */
function latencySeries(
  spec: SloSpec,
  model: string,
  threshold: number,
  segments: readonly Segment[],
  allModels: boolean,
): InputSeries[] {
  if (!allModels) {
    const base = { job: jobOf(spec, 'router'), instance: instanceOf('router'), model };
    // Timed per served version too: a rule that did not sum the versions would miss half the traffic.
    return [
      ...histogramSeries(
        ROUTER_DURATION,
        { ...base, version: '1', cached: 'true' },
        threshold,
        segments,
        (s) => 0.1 * s.total,
        (s) => 0.1 * s.total,
      ),
      ...histogramSeries(
        ROUTER_DURATION,
        { ...base, version: '2', cached: 'false' },
        threshold,
        segments,
        (s) => 0.9 * s.total,
        (s) => 0.9 * s.total - s.bad,
      ),
    ];
  }
  const base = { job: jobOf(spec, 'gateway'), instance: instanceOf('gateway') };
  const inference = [
    { protocol: 'grpc', endpoint: 'ModelInfer', code: 'OK', share: 0.5 },
    { protocol: 'rest', endpoint: 'POST /v2/models/:model/infer', code: '200', share: 0.3 },
    { protocol: 'rest', endpoint: 'POST /v2/models/:model/versions/:version/infer', code: '200', share: 0.2 },
  ];
  return [
    ...inference.flatMap(({ share, ...labels }) =>
      histogramSeries(
        GATEWAY_DURATION,
        { ...base, ...labels },
        threshold,
        segments,
        (s) => share * s.total,
        (s) => share * (s.total - s.bad),
      ),
    ),
    // Not in the SLI: slow admin requests, and slow failures (the availability SLI counts those).
    ...histogramSeries(
      GATEWAY_DURATION,
      { ...base, protocol: 'rest', endpoint: 'GET /admin/v1/models', code: '200' },
      threshold,
      segments,
      (s) => s.total,
      () => 0,
    ),
    ...histogramSeries(
      GATEWAY_DURATION,
      { ...base, protocol: 'grpc', endpoint: 'ModelInfer', code: 'UNAVAILABLE' },
      threshold,
      segments,
      (s) => 0.05 * s.total,
      () => 0,
    ),
  ];
}

function sliSeries(spec: SloSpec, slo: Slo, model: string, segments: readonly Segment[]): InputSeries[] {
  return slo.sli === 'availability'
    ? availabilitySeries(spec, model, segments, slo.scope.kind === 'all')
    : latencySeries(spec, model, slo.target.threshold, segments, slo.scope.kind === 'all');
}

const minutesOf = (window: string) => parseDurationMs(window)! / 60_000;

/** The error ratio of a scenario over the last `window` at its end. */
function ratioOver(segments: readonly Segment[], window: string): number {
  let left = minutesOf(window);
  let bad = 0;
  let total = 0;
  for (const segment of [...segments].reverse()) {
    const minutes = Math.min(left, segment.minutes);
    bad += minutes * segment.bad;
    total += minutes * segment.total;
    left -= minutes;
  }
  return bad / total;
}

/** The burn-rate scenarios of an objective, each checked against the alert conditions it is meant to meet and no other. */
function burnScenarios(slo: Slo): Scenario[] {
  const budget = errorBudget(slo.target.objective);
  const conditions = (['page', 'ticket'] as const).flatMap((severity) =>
    burnConditions(slo, severity).map((c) => ({ ...c, severity })),
  );
  return conditions.flatMap((c) => {
    const threshold = c.rate * budget;
    const burst = minutesOf(c.longWindow) + 5;
    const quiet = minutesOf(c.shortWindow) + 5;
    const before: Segment = { minutes: EVAL_MINUTES - burst, total: 2 * RATE, bad: 0 };
    const scenarios: Scenario[] = [
      {
        name: `${c.longWindow}-${c.shortWindow} at ${1 + THRESHOLD_MARGIN}× ${c.rate}× the budget rate`,
        segments: [before, { minutes: burst, total: RATE, bad: (1 + THRESHOLD_MARGIN) * threshold * RATE }],
        fires: c.severity,
      },
      {
        name: `${c.longWindow}-${c.shortWindow} at ${1 - THRESHOLD_MARGIN}× ${c.rate}× the budget rate`,
        segments: [before, { minutes: burst, total: RATE, bad: (1 - THRESHOLD_MARGIN) * threshold * RATE }],
        fires: undefined,
      },
      {
        name: `${c.longWindow}-${c.shortWindow} at ${RECOVERED_FACTOR}× ${c.rate}× the budget rate, then no ${slo.sli === 'availability' ? 'errors' : 'slow requests'} for the last ${promDuration(quiet * 60_000)}`,
        segments: [
          before,
          { minutes: burst - quiet, total: RATE, bad: RECOVERED_FACTOR * threshold * RATE },
          { minutes: quiet, total: RATE, bad: 0 },
        ],
        fires: undefined,
      },
    ];
    for (const scenario of scenarios) {
      // The scenario must meet exactly the condition it tests (or none): else a test would pass for the wrong reason.
      const met = conditions.filter((other) => {
        const limit = other.rate * budget;
        return (
          ratioOver(scenario.segments, other.longWindow) > limit &&
          ratioOver(scenario.segments, other.shortWindow) > limit
        );
      });
      const expected = scenario.fires === undefined ? [] : [c];
      if (met.length !== expected.length || met.some((m, i) => m !== expected[i])) {
        throw new Error(
          `${slo.id}: the test scenario "${scenario.name}" would meet the conditions ${met.map((m) => `${m.longWindow}-${m.shortWindow}`).join(', ') || '(none)'}; the generator cannot test this objective`,
        );
      }
      if (scenario.segments.some((s) => s.bad > 0.8 * s.total)) {
        throw new Error(
          `${slo.id}: objective ${slo.target.objective} % is too loose for the generated tests (a scenario needs an error ratio over 80 %)`,
        );
      }
    }
    return scenarios;
  });
}

/** An alert's annotations with `{{ $labels.x }}` filled in, as promtool compares them. */
function expand(text: string, labels: Record<string, string>): string {
  const expanded = text.replace(/\{\{ \$labels\.([a-zA-Z_]+) \}\}/g, (_m, name: string) => {
    const value = labels[name];
    if (value === undefined)
      throw new Error(`an annotation names the label ${name}, which the alert does not have: ${text}`);
    return value;
  });
  if (expanded.includes('{{')) throw new Error(`the test generator expands only {{ $labels.<name> }}: ${text}`);
  return expanded;
}

function expectAlert(rule: AlertingRule, labels: Record<string, string>): ExpectedAlert {
  const all = { ...labels, ...rule.labels };
  return {
    exp_labels: all,
    exp_annotations: {
      summary: expand(rule.annotations.summary, all),
      description: expand(rule.annotations.description, all),
      runbook: expand(rule.annotations.runbook, all),
    },
  };
}

function ruleOf(groups: readonly RuleGroup[], name: string, severity?: Severity): AlertingRule {
  const rule = groups
    .flatMap((g) => g.rules)
    .find(
      (r): r is AlertingRule =>
        'alert' in r && r.alert === name && (severity === undefined || r.labels.severity === severity),
    );
  if (rule === undefined) throw new Error(`no alert ${name}${severity === undefined ? '' : ` (${severity})`}`);
  return rule;
}

function testFile(groups: readonly RuleGroup[], evaluationInterval: string, tests: TestGroup[]): TestFile {
  return {
    rule_files: ['../rules.yaml'],
    evaluation_interval: evaluationInterval,
    group_eval_order: groups.map((g) => g.name),
    tests,
  };
}

/** The labels an objective's SLI series carry, besides the model of a per-model one. */
function sliLabels(slo: Slo, model: string | undefined): Record<string, string> {
  return {
    ...(model === undefined ? {} : { model }),
    ...(slo.sli === 'latency' ? { threshold: le(slo.target.threshold) } : {}),
  };
}

/**
 * The test of one objective's burn-rate alerts. They have no `for` and the SLIs they read depend on
 * the input series alone, so one evaluation at the end decides: the evaluation interval is the
 * scenarios' length (promtool evaluates every rule group at each interval, 73 times slower at 1h).
 */
function burnTests(spec: SloSpec, groups: readonly RuleGroup[], slo: Slo): TestFile {
  const alertname = burnAlertName(slo);
  const scenarios = burnScenarios(slo);
  const evalTime = promDuration(EVAL_MINUTES * 60_000);
  const expected = (scenario: Scenario, model: string | undefined) =>
    scenario.fires === undefined ? [] : [expectAlert(ruleOf(groups, alertname, scenario.fires), sliLabels(slo, model))];
  if (slo.scope.kind !== 'eachModel') {
    const model = slo.scope.kind === 'model' ? slo.scope.model : 'tiny';
    return testFile(
      groups,
      evalTime,
      scenarios.map((scenario) => ({
        name: `${alertname}: ${scenario.name} ${scenario.fires === undefined ? 'does not fire' : `fires (${scenario.fires})`}`,
        interval: '1m',
        input_series: sliSeries(spec, slo, model, scenario.segments),
        alert_rule_test: [
          {
            eval_time: evalTime,
            alertname,
            exp_alerts: expected(scenario, slo.scope.kind === 'model' ? model : undefined),
          },
        ],
      })),
    );
  }
  // Each model is its own scenario, all in one test; the models with objectives of their own and the
  // pseudo models burn their whole budget in every window without firing this alert.
  const models = scenarios.map((scenario, i) => ({ scenario, model: `scenario-${i + 1}` }));
  const excluded = [...slo.scope.except, ...PSEUDO_MODELS];
  const burning: Segment[] = [{ minutes: EVAL_MINUTES, total: RATE, bad: 0.5 * RATE }];
  return testFile(groups, evalTime, [
    {
      name: `${alertname}: ${models.map(({ scenario, model }) => `${model} ${scenario.name} ${scenario.fires === undefined ? 'does not fire' : `fires (${scenario.fires})`}`).join('; ')}; ${excluded.join(', ')} are left to their own objectives`,
      interval: '1m',
      input_series: [
        ...models.flatMap(({ scenario, model }) => sliSeries(spec, slo, model, scenario.segments)),
        ...excluded.flatMap((model) => sliSeries(spec, slo, model, burning)),
      ],
      alert_rule_test: [
        {
          eval_time: evalTime,
          alertname,
          exp_alerts: models.flatMap(({ scenario, model }) => expected(scenario, model)),
        },
      ],
    },
  ]);
}

const minutes = (ms: number) => ms / 60_000;
const at = (m: number) => (m === 0 ? '0m' : promDuration(m * 60_000));

/** `value` for minutes 0 to n - 1, then `then` until minute `end`. */
function steps(value: number, n: number, then: number, end: number): string {
  return `${value}x${n - 1} ${then}x${end - n}`;
}

/** The tests of the operational alerts: each at its threshold (and for its `for`) fires, just below it does not. */
function operationsTests(spec: SloSpec, groups: readonly RuleGroup[]): TestFile {
  const a = spec.alerts;
  const alerts = new Map(operationalAlerts(spec).map((r) => [r.alert, r]));
  const rule = (name: string) => alerts.get(name) ?? ruleOf(groups, name);
  const check = (name: string, evalMinutes: number, firing: Record<string, string>[]): AlertRuleTest => ({
    eval_time: at(evalMinutes),
    alertname: name,
    exp_alerts: firing.map((labels) => expectAlert(rule(name), labels)),
  });
  const tests: TestGroup[] = [];

  {
    const forM = minutes(a.serviceDown.forMs);
    const downAt = 11;
    const end = downAt + forM + 5;
    const job = (service: string) => jobOf(spec, service);
    tests.push({
      name: 'InfermeshServiceDown: a job whose every instance is down fires after its `for`; one with an instance up does not; one without targets fires',
      interval: '1m',
      input_series: [
        { series: series('up', { job: job('gateway'), instance: instanceOf('gateway', 1) }), values: `1x${end}` },
        { series: series('up', { job: job('gateway'), instance: instanceOf('gateway', 2) }), values: `0x${end}` },
        {
          series: series('up', { job: job('registry'), instance: instanceOf('registry') }),
          values: steps(1, downAt, 0, end),
        },
        // job('cache') has no target at all.
        ...(['router', 'batcher', 'worker'] as const).map((s) => ({
          series: series('up', { job: job(s), instance: instanceOf(s) }),
          values: `1x${end}`,
        })),
      ],
      alert_rule_test: [
        check('InfermeshServiceDown', downAt + forM - 1, [{ job: job('cache') }]),
        check('InfermeshServiceDown', downAt + forM, [{ job: job('cache') }, { job: job('registry') }]),
      ],
    });
  }
  {
    const forM = minutes(a.noWorkerReachable.forMs);
    const base = { job: jobOf(spec, 'batcher') };
    tests.push({
      name: 'InfermeshBatcherNoWorkerReachable: 0 workers reachable for its `for` fires, 1 does not',
      interval: '1m',
      input_series: [
        {
          series: series('infermesh_batcher_workers_reachable', { ...base, instance: instanceOf('batcher', 1) }),
          values: `0x${forM + 5}`,
        },
        {
          series: series('infermesh_batcher_workers_reachable', { ...base, instance: instanceOf('batcher', 2) }),
          values: `1x${forM + 5}`,
        },
      ],
      alert_rule_test: [
        check('InfermeshBatcherNoWorkerReachable', forM - 1, []),
        check('InfermeshBatcherNoWorkerReachable', forM, [{ ...base, instance: instanceOf('batcher', 1) }]),
      ],
    });
  }
  {
    const forM = minutes(a.queueNearBound.forMs);
    const depth = Math.ceil((a.queueNearBound.bound * a.queueNearBound.percent) / 100);
    const base = { job: jobOf(spec, 'batcher'), instance: instanceOf('batcher') };
    tests.push({
      name: `InfermeshBatcherQueueNearBound: a depth of ${depth} for its \`for\` fires, ${depth - 1} does not`,
      interval: '1m',
      input_series: [
        {
          series: series('infermesh_batcher_queue_depth', { ...base, model: 'tiny', version: '1' }),
          values: `${depth}x${forM + 5}`,
        },
        {
          series: series('infermesh_batcher_queue_depth', { ...base, model: 'mlp', version: '1' }),
          values: `${depth - 1}x${forM + 5}`,
        },
      ],
      alert_rule_test: [
        check('InfermeshBatcherQueueNearBound', forM - 1, []),
        check('InfermeshBatcherQueueNearBound', forM, [{ ...base, model: 'tiny', version: '1' }]),
      ],
    });
  }
  {
    const forM = minutes(a.queueFull.forMs);
    const base = { job: jobOf(spec, 'batcher'), instance: instanceOf('batcher') };
    const end = forM + 10;
    tests.push({
      name: 'InfermeshBatcherQueueFull: QUEUE_FULL refusals every minute for its `for` fire; none, or refusals for another reason, do not',
      interval: '1m',
      input_series: [
        {
          series: series('infermesh_batcher_rejections_total', { ...base, model: 'tiny', reason: 'QUEUE_FULL' }),
          values: `0+1x${end}`,
        },
        {
          series: series('infermesh_batcher_rejections_total', { ...base, model: 'mlp', reason: 'QUEUE_FULL' }),
          values: `7x${end}`,
        },
        {
          series: series('infermesh_batcher_rejections_total', {
            ...base,
            model: 'classifier',
            reason: 'DEADLINE_INFEASIBLE',
          }),
          values: `0+1x${end}`,
        },
      ],
      // The rate is first seen a minute in (two samples), and pending from then on.
      alert_rule_test: [
        check('InfermeshBatcherQueueFull', forM, []),
        check('InfermeshBatcherQueueFull', forM + 1, [{ ...base, model: 'tiny' }]),
      ],
    });
  }
  {
    const forM = minutes(a.circuitOpen.forMs);
    const end = forM + 5;
    const base = { job: jobOf(spec, 'router') };
    tests.push({
      name: 'InfermeshRouterCircuitOpen: a circuit half-open or open on any router for its `for` fires; closed, or open for less, does not',
      interval: '1m',
      input_series: [
        {
          series: series('infermesh_router_circuit_state', {
            ...base,
            instance: instanceOf('router', 1),
            model: 'tiny',
            version: '1',
          }),
          values: `1x${end}`,
        },
        {
          series: series('infermesh_router_circuit_state', {
            ...base,
            instance: instanceOf('router', 1),
            model: 'mlp',
            version: '1',
          }),
          values: `0x${end}`,
        },
        {
          series: series('infermesh_router_circuit_state', {
            ...base,
            instance: instanceOf('router', 1),
            model: 'classifier',
            version: '2',
          }),
          values: steps(2, forM, 0, end),
        },
        {
          series: series('infermesh_router_circuit_state', {
            ...base,
            instance: instanceOf('router', 1),
            model: 'identity',
            version: '3',
          }),
          values: `2x${end}`,
        },
        {
          series: series('infermesh_router_circuit_state', {
            ...base,
            instance: instanceOf('router', 2),
            model: 'identity',
            version: '3',
          }),
          values: `0x${end}`,
        },
      ],
      alert_rule_test: [
        check('InfermeshRouterCircuitOpen', forM - 1, []),
        check('InfermeshRouterCircuitOpen', forM, [
          { model: 'tiny', version: '1' },
          { model: 'identity', version: '3' },
        ]),
      ],
    });
  }
  {
    const afterS = a.registryWatchDisconnected.afterMs / 1000;
    const afterM = Math.ceil(afterS / 60);
    const end = afterM + 5;
    const label = (s: string) => ({ job: jobOf(spec, s), instance: instanceOf(s) });
    tests.push({
      name: `InfermeshRegistryWatchDisconnected: a configuration ${afterS} s old fires, ${afterS - 1} s does not`,
      interval: '1m',
      input_series: [
        // Disconnected from minute 0: the age grows a minute a minute.
        {
          series: series('infermesh_router_registry_watch_config_age_seconds', label('router')),
          values: `0+60x${end}`,
        },
        {
          series: series('infermesh_batcher_registry_watch_config_age_seconds', label('batcher')),
          values: `${afterS - 1}x${end}`,
        },
        { series: series('infermesh_worker_registry_watch_config_age_seconds', label('worker')), values: `0x${end}` },
      ],
      alert_rule_test: [
        check('InfermeshRegistryWatchDisconnected', afterM - 1, []),
        check('InfermeshRegistryWatchDisconnected', afterM, [label('router')]),
      ],
    });
  }
  {
    const forM = minutes(a.workerMemoryBudget.forMs);
    const end = forM + 5;
    const budget = 1e9;
    const full = round((budget * a.workerMemoryBudget.percent) / 100);
    const base = { job: jobOf(spec, 'worker') };
    const w = (instance: string, labels: Record<string, string> = {}) => ({ ...base, instance, ...labels });
    tests.push({
      name: `InfermeshWorkerMemoryBudgetExhausted: ${a.workerMemoryBudget.percent} % of the budget charged (over two devices) for its \`for\` fires, 0.1 % less does not`,
      interval: '1m',
      input_series: [
        {
          series: series('infermesh_worker_memory_budget_bytes', w(instanceOf('worker', 1))),
          values: `${budget}x${end}`,
        },
        {
          series: series('infermesh_worker_models_loaded_bytes', w(instanceOf('worker', 1), { device: 'cpu' })),
          values: `${round(full * 0.6)}x${end}`,
        },
        {
          series: series('infermesh_worker_models_loaded_bytes', w(instanceOf('worker', 1), { device: 'cuda' })),
          values: `${round(full - round(full * 0.6))}x${end}`,
        },
        {
          series: series('infermesh_worker_memory_budget_bytes', w(instanceOf('worker', 2))),
          values: `${budget}x${end}`,
        },
        {
          series: series('infermesh_worker_models_loaded_bytes', w(instanceOf('worker', 2), { device: 'cpu' })),
          values: `${round(full - budget / 1000)}x${end}`,
        },
      ],
      alert_rule_test: [
        check('InfermeshWorkerMemoryBudgetExhausted', forM - 1, []),
        check('InfermeshWorkerMemoryBudgetExhausted', forM, [w(instanceOf('worker', 1))]),
      ],
    });
  }
  const tested = new Set(tests.flatMap((t) => t.alert_rule_test.map((c) => c.alertname)));
  const untested = [...alerts.keys()].filter((name) => !tested.has(name));
  if (untested.length > 0) throw new Error(`operational alerts without a test: ${untested.join(', ')}`);
  return testFile(groups, '1m', tests);
}

/** Every promtool test file of the spec, by file name (under grafana/slo/tests/). */
export function sloTestFiles(spec: SloSpec, groups: readonly RuleGroup[]): Map<string, TestFile> {
  const files = new Map<string, TestFile>();
  for (const slo of spec.slos) files.set(`slo-${slo.id}.yaml`, burnTests(spec, groups, slo));
  files.set('operations.yaml', operationsTests(spec, groups));
  return files;
}
