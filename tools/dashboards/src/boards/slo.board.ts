import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, choiceVariable, labelVariable, statPanel, timeSeries, type Query } from '../panels';
import { MODEL, oneOf, quantile, RATE, ratio, sel, sumRate } from '../promql';

const INFERENCES = 'infermesh_gateway_inference_requests_total';
const ROUTER_DURATION = 'infermesh_router_request_duration_seconds';
const GATEWAY_DURATION = 'infermesh_gateway_request_duration_seconds';

/**
 * Outcomes of infermesh_gateway_inference_requests_total that are the service's failures: they spend
 * the error budget. The counter's other outcomes are answers (ok, cached, degraded: the router
 * answered, services/gateway/src/gateway-metrics.ts SERVED_OUTCOMES) or the client's doing (a gRPC
 * status in lower case such as invalid_argument, not_found, permission_denied, cancelled). The same
 * list as `sli.availability.errorOutcomes` in grafana/slo/slos.yaml, which the SLO alerts use.
 */
export const ERROR_OUTCOMES = [
  'unavailable',
  'internal',
  'unknown',
  'data_loss',
  'deadline_exceeded',
  'resource_exhausted',
  'overloaded',
];

/** The gateway endpoints (REST route templates and the gRPC method) that run an inference. */
export const INFER_ENDPOINTS = 'endpoint=~"ModelInfer|POST /v2/models/.+/infer"';

/** The availability objective, in percent, that the board starts with. */
export const DEFAULT_AVAILABILITY_OBJECTIVE = '99.5';
/** The latency SLI's threshold, in seconds: one of the latency histograms' bucket bounds. */
export const DEFAULT_LATENCY_THRESHOLD = '0.25';
/** The latency objective, in percent: the share of served requests answered within the threshold. */
export const DEFAULT_LATENCY_OBJECTIVE = '99';

/** The burn-rate windows, with the rates that multiwindow alerts usually page or ticket at. */
const BURN_WINDOWS = ['5m', '1h', '6h', '1d'];

const requests = (window: string) => sumRate(INFERENCES, sel(MODEL), ['model'], window);
const failed = (window: string) =>
  sumRate(INFERENCES, sel(MODEL, `outcome=~"${oneOf(ERROR_OUTCOMES)}"`), ['model'], window);
/** The share of inference requests that failed, per model, over `window`. */
const errorRatio = (window: string) => ratio(failed(window), requests(window));
const availability = (window: string) => `1 - (${errorRatio(window)})`;
const burnRate = (window: string) => `(${errorRatio(window)}) / (1 - $slo / 100)`;

/** The share of served requests that the router answered within $latency_threshold, per model. */
const latencySli = (window: string) =>
  `${sumRate(`${ROUTER_DURATION}_bucket`, sel(MODEL, 'le="$latency_threshold"'), ['model'], window)} / ${sumRate(`${ROUTER_DURATION}_count`, sel(MODEL), ['model'], window)}`;

const AVAILABILITY_STEPS = [
  { value: null, color: 'red' },
  { value: 0.99, color: 'orange' },
  { value: 0.995, color: 'green' },
];
const BUDGET_STEPS = [
  { value: null, color: 'red' },
  { value: 0, color: 'orange' },
  { value: 0.25, color: 'yellow' },
  { value: 0.5, color: 'green' },
];
const BURN_STEPS = [
  { value: null, color: 'green' },
  { value: 1, color: 'yellow' },
  { value: 6, color: 'orange' },
  { value: 14.4, color: 'red' },
];

const SLI_NOTE =
  `Availability SLI: the share of inference requests at the gateway that did not fail with an error outcome (${ERROR_OUTCOMES.join(', ')}); ` +
  "answers (ok, cached, degraded) and the client's own errors (invalid_argument, not_found, permission_denied, cancelled, …) count as good. " +
  'The model "(not routed)" holds the requests the gateway refused at its in-flight limit (overloaded) before any model was resolved.';

export function sloBoard(): dashboard.Dashboard {
  const burnQueries: Query[] = BURN_WINDOWS.map((window) => ({
    expr: burnRate(window),
    legend: `{{model}} · ${window}`,
  }));
  return buildBoard({
    uid: 'infermesh-slo',
    title: 'infermesh / SLO overview',
    description:
      'Availability and latency SLIs per model, the error budget left over 30 days and its burn rate. ' +
      `The objectives are the variables $slo (availability, default ${DEFAULT_AVAILABILITY_OBJECTIVE} %), $latency_objective (default ${DEFAULT_LATENCY_OBJECTIVE} %) and $latency_threshold (default ${DEFAULT_LATENCY_THRESHOLD} s).`,
    tags: ['slo'],
    variables: [
      labelVariable('model', 'Model', 'Models the gateway has answered for.', `label_values(${INFERENCES}, model)`),
      choiceVariable(
        'slo',
        'Availability objective (%)',
        'The availability SLO: the share of inference requests over 30 days that must not fail with an error outcome. The error budget is 100 % minus it.',
        ['99', '99.5', '99.9', '99.95', '99.99'],
        DEFAULT_AVAILABILITY_OBJECTIVE,
      ),
      choiceVariable(
        'latency_threshold',
        'Latency threshold (s)',
        "A served request is fast when the router answered it within this many seconds; the values are the latency histogram's bucket bounds (libs/telemetry LATENCY_BUCKETS_SECONDS).",
        ['0.05', '0.1', '0.25', '0.5', '1', '2.5', '5'],
        DEFAULT_LATENCY_THRESHOLD,
      ),
      choiceVariable(
        'latency_objective',
        'Latency objective (%)',
        'The latency SLO: the share of served requests over 30 days that must be answered within the latency threshold.',
        ['90', '95', '99', '99.5', '99.9'],
        DEFAULT_LATENCY_OBJECTIVE,
      ),
    ],
    rows: [
      {
        title: 'Availability',
        panels: [
          statPanel({
            title: 'Availability, last 30 days',
            description: `${SLI_NOTE} Green from 99.5 %, the default objective.`,
            unit: 'percentunit',
            decimals: 3,
            span: 6,
            thresholds: AVAILABILITY_STEPS,
            queries: [{ expr: availability('30d'), legend: '{{model}}' }],
          }),
          statPanel({
            title: 'Error budget left, last 30 days',
            description:
              'The share of the 30-day error budget (100 % − $slo) not spent yet: 100 % with no failure, 0 % when the failures reached the budget, negative past it. ' +
              SLI_NOTE,
            unit: 'percentunit',
            decimals: 1,
            span: 6,
            thresholds: BUDGET_STEPS,
            queries: [{ expr: `1 - (${errorRatio('30d')}) / (1 - $slo / 100)`, legend: '{{model}}' }],
          }),
          timeSeries({
            title: 'Availability SLI',
            description: `The availability SLI over each step's rate window. ${SLI_NOTE}`,
            unit: 'percentunit',
            decimals: 3,
            max: 1,
            thresholds: AVAILABILITY_STEPS,
            queries: [{ expr: availability(RATE), legend: '{{model}}' }],
          }),
        ],
      },
      {
        title: 'Error budget burn rate',
        panels: [
          timeSeries({
            title: 'Burn rate per window',
            description:
              'How fast the error budget burns: the error ratio over the window divided by the budget (100 % − $slo); 1 spends exactly the budget in 30 days. ' +
              'Multiwindow alerts usually page at 14.4 (1 h and 5 m: 2 % of the budget in an hour) and at 6 (6 h and 30 m), and open a ticket at 1 (1 d and 2 h). ' +
              SLI_NOTE,
            unit: 'suffix:×',
            span: 16,
            thresholds: BURN_STEPS,
            queries: burnQueries,
          }),
          statPanel({
            title: 'Burn rate now',
            description:
              'The burn rate of each model over each window (5 m, 1 h, 6 h, 1 d), as of now. 1 spends the error budget in exactly 30 days; 14.4 spends 2 % of it in an hour.',
            unit: 'suffix:×',
            decimals: 2,
            span: 8,
            thresholds: BURN_STEPS,
            queries: burnQueries,
          }),
        ],
      },
      {
        title: 'Latency',
        panels: [
          statPanel({
            title: 'Latency SLI, last 30 days',
            description:
              'The share of served inference requests the router answered within $latency_threshold s (its request_duration_seconds histogram, which counts successful requests only and leaves out the gateway).',
            unit: 'percentunit',
            decimals: 3,
            span: 6,
            thresholds: [
              { value: null, color: 'red' },
              { value: 0.95, color: 'orange' },
              { value: 0.99, color: 'green' },
            ],
            queries: [{ expr: latencySli('30d'), legend: '{{model}}' }],
          }),
          statPanel({
            title: 'Latency budget left, last 30 days',
            description:
              'The share of the 30-day latency budget (100 % − $latency_objective of the served requests may be slower than $latency_threshold s) not spent yet.',
            unit: 'percentunit',
            decimals: 1,
            span: 6,
            thresholds: BUDGET_STEPS,
            queries: [
              { expr: `1 - (1 - (${latencySli('30d')})) / (1 - $latency_objective / 100)`, legend: '{{model}}' },
            ],
          }),
          timeSeries({
            title: 'Latency SLI',
            description:
              'Per model: the share of served requests the router answered within $latency_threshold s. All models: the share of inference calls (any outcome) the gateway answered within it, its own work included.',
            unit: 'percentunit',
            decimals: 3,
            max: 1,
            queries: [
              { expr: latencySli(RATE), legend: '{{model}}' },
              {
                expr: `${sumRate(`${GATEWAY_DURATION}_bucket`, sel(INFER_ENDPOINTS, 'le="$latency_threshold"'))} / ${sumRate(`${GATEWAY_DURATION}_count`, sel(INFER_ENDPOINTS))}`,
                legend: 'all models, at the gateway',
              },
            ],
          }),
          timeSeries({
            title: 'Inference latency per model (router)',
            description:
              'p50 and p99 of the time the router took to route and answer a served request (request_duration_seconds), per model.',
            unit: 's',
            queries: [
              { expr: quantile(0.5, ROUTER_DURATION, sel(MODEL), ['model']), legend: '{{model}} p50' },
              { expr: quantile(0.99, ROUTER_DURATION, sel(MODEL), ['model']), legend: '{{model}} p99' },
            ],
          }),
          timeSeries({
            title: 'Inference latency at the gateway',
            description:
              "p99 of the gateway's inference calls by endpoint (REST route or gRPC method), any outcome. The gateway's histogram has no model label: this is all models together.",
            unit: 's',
            queries: [
              {
                expr: quantile(0.99, GATEWAY_DURATION, sel(INFER_ENDPOINTS), ['endpoint']),
                legend: '{{endpoint}} p99',
              },
            ],
          }),
        ],
      },
      {
        title: 'Traffic',
        panels: [
          timeSeries({
            title: 'Inference requests by outcome',
            description:
              'Inference requests per second at the gateway by outcome: ok, cached, degraded (answered by the fallback model) or the gRPC status of the failure.',
            unit: 'reqps',
            stack: true,
            queries: [{ expr: sumRate(INFERENCES, sel(MODEL), ['outcome']), legend: '{{outcome}}' }],
          }),
          timeSeries({
            title: 'Inference requests per model',
            description: 'Inference requests per second at the gateway, per model, any outcome.',
            unit: 'reqps',
            queries: [{ expr: sumRate(INFERENCES, sel(MODEL), ['model']), legend: '{{model}}' }],
          }),
        ],
      },
    ],
  });
}
