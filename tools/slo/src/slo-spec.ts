import { fieldPath } from '@infermesh/config';
import { isModelId } from '@infermesh/rollout';
import { LATENCY_BUCKETS_SECONDS } from '@infermesh/telemetry';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';

/**
 * The SLO spec (`grafana/slo/slos.yaml`): the service level objectives of inference and the
 * thresholds of the operational alerts. tools/slo compiles it into Prometheus rules and their
 * promtool tests, so it is validated here once, completely, and every problem names its field.
 */

/** A spec that cannot be used: every problem, each naming its field (`objectives.all.availability.objective: ...`). */
export class SloSpecError extends Error {
  constructor(
    readonly source: string,
    readonly problems: readonly string[],
  ) {
    super(`${source}: invalid SLO spec:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'SloSpecError';
  }
}

/**
 * Outcomes of `infermesh_gateway_inference_requests_total` that are answers (services/gateway's
 * SERVED_OUTCOMES): never errors.
 */
export const SUCCESS_OUTCOMES = ['ok', 'cached', 'degraded'] as const;

/**
 * The other outcomes the gateway counts: its own refusal past GATEWAY_MAX_IN_FLIGHT (`overloaded`,
 * model `(not routed)`), else the gRPC status of the failure, lower-cased (services/gateway's
 * ModelInference).
 */
export const FAILURE_OUTCOMES = [
  'overloaded',
  'cancelled',
  'unknown',
  'invalid_argument',
  'deadline_exceeded',
  'not_found',
  'already_exists',
  'permission_denied',
  'resource_exhausted',
  'failed_precondition',
  'aborted',
  'out_of_range',
  'unimplemented',
  'internal',
  'unavailable',
  'data_loss',
  'unauthenticated',
] as const;
export type FailureOutcome = (typeof FAILURE_OUTCOMES)[number];

const DURATION_UNITS_MS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** "250ms", "1.5s", "2m", "1h", "30d" in milliseconds; undefined when it is not such a duration. */
export function parseDurationMs(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(text.trim());
  if (match === null) return undefined;
  const ms = Number(match[1]) * DURATION_UNITS_MS[match[2]!]!;
  return Number.isFinite(ms) ? ms : undefined;
}

/** A duration in Prometheus' notation, in its largest whole unit: 300000 → "5m". */
export function promDuration(ms: number): string {
  for (const [unit, size] of [
    ['d', 86_400_000],
    ['h', 3_600_000],
    ['m', 60_000],
    ['s', 1_000],
  ] as const) {
    if (ms >= size && ms % size === 0) return `${ms / size}${unit}`;
  }
  return `${ms}ms`;
}

/** A duration written with its unit ("250ms", "5m", "30d"), in milliseconds, above 0. */
const duration = (options: { minMs?: number; units?: string } = {}) =>
  z.union([z.string(), z.number()]).transform((value, ctx) => {
    const ms = typeof value === 'string' ? parseDurationMs(value) : undefined;
    if (ms === undefined) {
      ctx.addIssue({
        code: 'custom',
        message: `expected a duration with its unit, such as ${options.units ?? '250ms, 10s or 5m'} (got ${JSON.stringify(value)})`,
      });
      return z.NEVER;
    }
    if (ms <= 0 || ms < (options.minMs ?? 0)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be ${options.minMs === undefined ? 'more than zero' : `at least ${promDuration(options.minMs)}`} (got ${JSON.stringify(value)})`,
      });
      return z.NEVER;
    }
    return ms;
  });

/** A whole number of seconds or more, as Prometheus writes `for:`. */
const wholeSeconds = duration().refine((ms) => ms % 1_000 === 0, 'must be a whole number of seconds');

const LATENCY_BOUNDS = LATENCY_BUCKETS_SECONDS.map((s) => `${+(s * 1000).toPrecision(12)}ms`).join(', ');

/** A latency threshold: one of the bucket bounds of the latency histograms (LATENCY_BUCKETS_SECONDS), in seconds. */
const latencyThreshold = duration().transform((ms, ctx) => {
  const seconds = LATENCY_BUCKETS_SECONDS.find((bound) => Math.abs(bound * 1000 - ms) <= 1e-9 * ms);
  if (seconds === undefined) {
    ctx.addIssue({
      code: 'custom',
      message: `${ms} ms is not a bucket bound of the latency histograms (LATENCY_BUCKETS_SECONDS in libs/telemetry), so no series counts the requests under it; use one of ${LATENCY_BOUNDS}`,
    });
    return z.NEVER;
  }
  return seconds;
});

/** A share of requests, in percent, strictly between 0 and 100. */
const objective = z
  .number()
  .gt(0, 'must be above 0 (percent)')
  .lt(100, 'must be below 100 (percent): an objective of 100 % leaves no error budget to alert on');

const availabilitySchema = z
  .object({
    /** Percent of inference requests that must not fail with a server-side error. */
    objective,
  })
  .strict();

const latencySchema = z
  .object({
    /** Percent of the successful inference requests that must be answered within `threshold`. */
    objective,
    threshold: latencyThreshold,
  })
  .strict();

const objectivesSchema = z
  .object({ availability: availabilitySchema.optional(), latency: latencySchema.optional() })
  .strict()
  .refine(
    (o) => o.availability !== undefined || o.latency !== undefined,
    'names no objective: give availability, latency or both',
  );

const percent = z.number().gt(0).max(100);

const alertsSchema = z
  .object({
    /** The Prometheus job of each service is `<jobPrefix><service>`: infermesh-gateway, ... */
    jobPrefix: z
      .string()
      .regex(/^[a-zA-Z0-9_:-]*$/, 'expected letters, digits, `_`, `:` or `-`')
      .default('infermesh-'),
    serviceDown: z.object({ for: wholeSeconds }).strict(),
    noWorkerReachable: z.object({ for: wholeSeconds }).strict(),
    queueNearBound: z
      .object({
        /** The queue bound: BATCHER_DEFAULT_MAX_QUEUE_SIZE, as no metric exports it. */
        bound: z.number().int().min(1),
        percent,
        for: wholeSeconds,
      })
      .strict(),
    queueFull: z.object({ for: wholeSeconds }).strict(),
    circuitOpen: z.object({ for: wholeSeconds }).strict(),
    registryWatchDisconnected: z.object({ after: wholeSeconds }).strict(),
    workerMemoryBudget: z.object({ percent, for: wholeSeconds }).strict(),
  })
  .strict();

const specSchema = z
  .object({
    /** The compliance window: the error budget is (100 % − objective) of the requests in it. */
    window: duration({ minMs: 7 * 86_400_000, units: '28d or 30d' }),
    sli: z
      .object({
        availability: z
          .object({
            /** Outcomes of infermesh_gateway_inference_requests_total that are server-side errors. */
            errorOutcomes: z.array(z.string()).min(1),
          })
          .strict(),
      })
      .strict(),
    objectives: z
      .object({
        /** Every inference request together, whatever its model. */
        all: objectivesSchema.optional(),
        /** Each model on its own (an alert per model), unless `models` names it. */
        eachModel: objectivesSchema.optional(),
        /** Models with objectives of their own; an SLI they leave out is eachModel's. */
        models: z.record(z.string(), objectivesSchema).default({}),
      })
      .strict(),
    alerts: alertsSchema,
  })
  .strict();

export interface AvailabilityObjective {
  /** Percent, e.g. 99.5. */
  objective: number;
}
export interface LatencyObjective {
  objective: number;
  /** Seconds, a bucket bound of the latency histograms. */
  threshold: number;
}
export type Sli = 'availability' | 'latency';

/** Which requests an objective is about. */
export type SloScope =
  { kind: 'all' } | { kind: 'eachModel'; except: readonly string[] } | { kind: 'model'; model: string };

/** One objective, ready to compile. */
export type Slo = { id: string; scope: SloScope; windowMs: number } & (
  { sli: 'availability'; target: AvailabilityObjective } | { sli: 'latency'; target: LatencyObjective }
);

export interface OperationalAlerts {
  jobPrefix: string;
  serviceDown: { forMs: number };
  noWorkerReachable: { forMs: number };
  queueNearBound: { bound: number; percent: number; forMs: number };
  queueFull: { forMs: number };
  circuitOpen: { forMs: number };
  registryWatchDisconnected: { afterMs: number };
  workerMemoryBudget: { percent: number; forMs: number };
}

export interface SloSpec {
  windowMs: number;
  /** Outcomes of infermesh_gateway_inference_requests_total that count against availability. */
  errorOutcomes: readonly FailureOutcome[];
  /** Every objective: all first, then eachModel, then the named models; availability before latency. */
  slos: readonly Slo[];
  alerts: OperationalAlerts;
}

/**
 * The budget-consumption alerts of the Google SRE workbook (chapter 5, "Alerting on SLOs", the
 * multiwindow, multi-burn-rate alerts): each fires when, over both windows, the error ratio is high
 * enough to spend this share of the budget of the whole compliance window within the long window.
 * Over 30 days these are burn rates of 14.4, 6, 3 and 1.
 */
export const BURN_RATE_ALERTS = [
  { severity: 'page', longWindow: '1h', shortWindow: '5m', budgetShare: 0.02 },
  { severity: 'page', longWindow: '6h', shortWindow: '30m', budgetShare: 0.05 },
  { severity: 'ticket', longWindow: '1d', shortWindow: '2h', budgetShare: 0.1 },
  { severity: 'ticket', longWindow: '3d', shortWindow: '6h', budgetShare: 0.1 },
] as const;
export type Severity = (typeof BURN_RATE_ALERTS)[number]['severity'];

/** The windows the SLIs are recorded over: every window of BURN_RATE_ALERTS. */
export const SLI_WINDOWS = ['5m', '30m', '1h', '2h', '6h', '1d', '3d'] as const;

/** The burn rate at which the error budget of `windowMs` is spent by `budgetShare` within `longWindow`. */
export function burnRate(windowMs: number, alert: (typeof BURN_RATE_ALERTS)[number]): number {
  return round(alert.budgetShare * (windowMs / parseDurationMs(alert.longWindow)!));
}

/** The error budget of an objective, as a ratio: 99.5 → 0.005. */
export function errorBudget(objectivePercent: number): number {
  return round((100 - objectivePercent) / 100);
}

/** Rounds away binary noise (0.07200000000000001 → 0.072) without losing any digit a spec can hold. */
export function round(value: number): number {
  return Number(value.toPrecision(12));
}

/**
 * Reads and validates a spec (YAML or JSON text). Throws an SloSpecError listing every problem, each
 * naming its field; a spec that passes compiles without further checks.
 */
export function parseSloSpec(text: string, source = 'SLO spec'): SloSpec {
  let document: unknown;
  try {
    document = parseYaml(text, { prettyErrors: true, uniqueKeys: true });
  } catch (error) {
    throw new SloSpecError(source, [`not valid YAML: ${error instanceof Error ? error.message : String(error)}`]);
  }
  const parsed = specSchema.safeParse(document);
  if (!parsed.success) {
    throw new SloSpecError(
      source,
      parsed.error.issues.map((issue) => `${fieldPath(issue.path) || '(document)'}: ${issue.message}`),
    );
  }
  const spec = parsed.data;
  const problems: string[] = [];

  const errorOutcomes: FailureOutcome[] = [];
  spec.sli.availability.errorOutcomes.forEach((outcome, i) => {
    const at = `sli.availability.errorOutcomes[${i}]`;
    if ((SUCCESS_OUTCOMES as readonly string[]).includes(outcome))
      problems.push(`${at}: "${outcome}" is an answer the router gave, not an error`);
    else if (!(FAILURE_OUTCOMES as readonly string[]).includes(outcome)) {
      problems.push(
        `${at}: the gateway counts no outcome "${outcome}"; its failure outcomes are ${FAILURE_OUTCOMES.join(', ')}`,
      );
    } else if (errorOutcomes.includes(outcome as FailureOutcome)) problems.push(`${at}: "${outcome}" is listed twice`);
    else errorOutcomes.push(outcome as FailureOutcome);
  });

  // The page alert of the 1h window needs an error ratio of (its burn rate × the budget): above 1 it could never fire.
  const fastest = burnRate(spec.window, BURN_RATE_ALERTS[0]);
  const checkReachable = (at: string, percentObjective: number) => {
    const ratio = fastest * errorBudget(percentObjective);
    if (ratio > 1) {
      const lowest = round(100 - 100 / fastest);
      problems.push(
        `${at}: an objective of ${percentObjective} % over ${promDuration(spec.window)} leaves a budget so large that its fast-burn page ` +
          `(${fastest}× over 1h) would need an error ratio of ${round(ratio * 100)} %, so it could never fire; objectives must be at least ${lowest} %`,
      );
    }
  };

  const modelNames = Object.keys(spec.objectives.models);
  const alertNames = new Map<string, string>();
  const slos: Slo[] = [];
  const add = (at: string, scope: SloScope, objectives: z.infer<typeof objectivesSchema>) => {
    const id = scope.kind === 'all' ? 'all' : scope.kind === 'eachModel' ? 'each-model' : `model-${scope.model}`;
    const name = alertNameOf(scope);
    const other = alertNames.get(name);
    if (other !== undefined) problems.push(`${at}: its alerts would be named ${name}*, as those of ${other} are`);
    alertNames.set(name, at);
    if (objectives.availability !== undefined) {
      checkReachable(`${at}.availability.objective`, objectives.availability.objective);
      slos.push({
        id: `${id}-availability`,
        scope,
        windowMs: spec.window,
        sli: 'availability',
        target: objectives.availability,
      });
    }
    if (objectives.latency !== undefined) {
      checkReachable(`${at}.latency.objective`, objectives.latency.objective);
      slos.push({ id: `${id}-latency`, scope, windowMs: spec.window, sli: 'latency', target: objectives.latency });
    }
  };
  const { all, eachModel, models } = spec.objectives;
  if (all !== undefined) add('objectives.all', { kind: 'all' }, all);
  if (eachModel !== undefined) add('objectives.eachModel', { kind: 'eachModel', except: modelNames }, eachModel);
  for (const model of modelNames) {
    const at = `objectives.models.${model}`;
    if (!isModelId(model)) {
      problems.push(`${at}: not a model id: a letter or digit, then up to 63 letters, digits, \`_\`, \`.\` or \`-\``);
      continue;
    }
    // An SLI the model leaves out is eachModel's; the model's own alerts replace eachModel's for it.
    add(
      at,
      { kind: 'model', model },
      {
        availability: models[model]!.availability ?? eachModel?.availability,
        latency: models[model]!.latency ?? eachModel?.latency,
      },
    );
  }
  if (slos.length === 0) problems.push('objectives: names no objective');

  if (problems.length > 0) throw new SloSpecError(source, problems);
  const a = spec.alerts;
  return {
    windowMs: spec.window,
    errorOutcomes,
    slos,
    alerts: {
      jobPrefix: a.jobPrefix,
      serviceDown: { forMs: a.serviceDown.for },
      noWorkerReachable: { forMs: a.noWorkerReachable.for },
      queueNearBound: { bound: a.queueNearBound.bound, percent: a.queueNearBound.percent, forMs: a.queueNearBound.for },
      queueFull: { forMs: a.queueFull.for },
      circuitOpen: { forMs: a.circuitOpen.for },
      registryWatchDisconnected: { afterMs: a.registryWatchDisconnected.after },
      workerMemoryBudget: { percent: a.workerMemoryBudget.percent, forMs: a.workerMemoryBudget.for },
    },
  };
}

/** The stem of an objective's alert names: InfermeshAll, InfermeshEachModel, InfermeshModelMultiIo. */
export function alertNameOf(scope: SloScope): string {
  switch (scope.kind) {
    case 'all':
      return 'InfermeshAll';
    case 'eachModel':
      return 'InfermeshEachModel';
    case 'model':
      return `InfermeshModel${scope.model
        .split(/[^a-zA-Z0-9]+/)
        .filter((part) => part !== '')
        .map((part) => part[0]!.toUpperCase() + part.slice(1))
        .join('')}`;
  }
}
