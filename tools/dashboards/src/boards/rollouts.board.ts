import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, labelVariable, statPanel, timeSeries, valueText } from '../panels';
import { MODEL, quantile, RANGE, ratio, sel, sumIncrease, sumRate } from '../promql';

const ROUTED = 'infermesh_router_routed_total';
const SHADOW = ['model', 'primary', 'shadow'];
const SHADOW_LEGEND = '{{model}} v{{primary}} → v{{shadow}}';

/** Requests the rollout policy routed (stable, canary or variant): those that named no version. */
const policyRouted = (labels: string[], window?: string) =>
  sumRate(ROUTED, sel(MODEL, 'route!="explicit"'), labels, window);

/** Each version's share of its model's requests among those routed as `routes` selects. */
function versionShare(routes: string): string {
  const selector = sel(MODEL, routes);
  return `${sumRate(ROUTED, selector, ['model', 'version'])} / on (model) group_left () ${sumRate(ROUTED, selector, ['model'])}`;
}

const PHASE = 'infermesh_registry_rollout_phase';

const CIRCUIT_STATES = valueText({
  0: { text: 'closed', color: 'green' },
  1: { text: 'half-open', color: 'orange' },
  2: { text: 'open', color: 'red' },
});

export function rolloutsBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-rollouts',
    title: 'infermesh / Rollouts',
    description:
      "How the router splits each model's traffic between its versions (stable, canary, A/B variants), where each automatic rollout stands, how a shadow version compares with the served one, the fallback model's answers and each version's circuit breaker.",
    tags: ['rollouts', 'router'],
    variables: [labelVariable('model', 'Model', 'Models the router has routed.', `label_values(${ROUTED}, model)`)],
    rows: [
      {
        title: 'Traffic split',
        panels: [
          statPanel({
            title: 'Canary share over the range',
            description:
              'The share of the requests the rollout policy routed (those naming no version) that went to the canary, over the whole time range.',
            unit: 'percentunit',
            decimals: 1,
            span: 6,
            queries: [
              {
                expr: ratio(
                  sumRate(ROUTED, sel(MODEL, 'route="canary"'), ['model'], RANGE),
                  policyRouted(['model'], RANGE),
                ),
                legend: '{{model}}',
              },
            ],
          }),
          timeSeries({
            title: 'Canary share',
            description:
              'The share of the requests the rollout policy routed that went to the canary version, per model.',
            unit: 'percentunit',
            span: 9,
            min: 0,
            max: 1,
            queries: [
              {
                expr: ratio(sumRate(ROUTED, sel(MODEL, 'route="canary"'), ['model']), policyRouted(['model'])),
                legend: '{{model}}',
              },
            ],
          }),
          timeSeries({
            title: 'Requests by route',
            description:
              'Requests per second by how the router chose their version: explicit (the request named it), stable, canary or variant.',
            unit: 'reqps',
            span: 9,
            stack: true,
            queries: [{ expr: sumRate(ROUTED, sel(MODEL), ['model', 'route']), legend: '{{model}} {{route}}' }],
          }),
          timeSeries({
            title: 'Version shares',
            description:
              "Each version's share of its model's policy-routed requests (stable, canary and variants together).",
            unit: 'percentunit',
            stack: true,
            min: 0,
            max: 1,
            queries: [{ expr: versionShare('route!="explicit"'), legend: '{{model}} v{{version}}' }],
          }),
          timeSeries({
            title: 'Variant shares',
            description: "Each A/B variant's share of its model's requests routed to a variant.",
            unit: 'percentunit',
            stack: true,
            min: 0,
            max: 1,
            queries: [{ expr: versionShare('route="variant"'), legend: '{{model}} v{{version}}' }],
          }),
        ],
      },
      {
        title: 'Automatic rollouts',
        panels: [
          statPanel({
            title: 'Automatic rollout phase now',
            description:
              "The phase of each model's automatic rollout (its last one): progressing, paused (by a manual rollout change), promoted, rolled_back (a gate failed: `npx infermesh rollout history` says which, with the figures) or aborted.",
            unit: 'short',
            span: 6,
            queries: [{ expr: `max by (model, phase) (${PHASE}${sel(MODEL)}) > 0`, legend: '{{model}}: {{phase}}' }],
          }),
          timeSeries({
            title: 'Canary percent set by the registry',
            description:
              "The share of requests each model's canary is given, in percent: an automatic rollout moves it step by step, to 100 before it promotes, to 0 when it rolls back.",
            unit: 'percent',
            span: 9,
            min: 0,
            max: 100,
            queries: [
              { expr: `max by (model) (infermesh_registry_rollout_canary_percent${sel(MODEL)})`, legend: '{{model}}' },
            ],
          }),
          timeSeries({
            title: 'Automatic rollout decisions',
            description:
              'Decisions of automatic rollouts per time step, by model and decision: started, advanced (a step passed), promoted, rolled_back, paused, resumed, aborted.',
            unit: 'short',
            span: 9,
            queries: [
              {
                expr: sumIncrease('infermesh_registry_rollout_decisions_total', sel(MODEL), ['model', 'decision']),
                legend: '{{model}} {{decision}}',
              },
            ],
          }),
        ],
      },
      {
        title: 'Shadow traffic',
        panels: [
          statPanel({
            title: 'Shadow agreement over the range',
            description:
              'The share of compared batch items (or whole outputs) on which the shadow version agreed with the served one (the same top class, or the same bits), over the whole time range.',
            unit: 'percentunit',
            decimals: 2,
            span: 6,
            thresholds: [
              { value: null, color: 'red' },
              { value: 0.95, color: 'orange' },
              { value: 0.99, color: 'green' },
            ],
            queries: [
              {
                expr: `${sumRate('infermesh_router_shadow_agreed_items_total', sel(MODEL), SHADOW, RANGE)} / ${sumRate('infermesh_router_shadow_compared_items_total', sel(MODEL), SHADOW, RANGE)}`,
                legend: SHADOW_LEGEND,
              },
            ],
          }),
          timeSeries({
            title: 'Shadow agreement',
            description:
              'The share of compared items on which the shadow agreed with the served version, per model and pair of versions.',
            unit: 'percentunit',
            span: 9,
            max: 1,
            queries: [
              {
                expr: `${sumRate('infermesh_router_shadow_agreed_items_total', sel(MODEL), SHADOW)} / ${sumRate('infermesh_router_shadow_compared_items_total', sel(MODEL), SHADOW)}`,
                legend: SHADOW_LEGEND,
              },
            ],
          }),
          timeSeries({
            title: 'Shadow requests and mismatched outputs',
            description:
              'Requests per second mirrored to a shadow version by outcome (ok or the gRPC status code), and shadow outputs of another shape or datatype than the served ones, or missing.',
            unit: 'reqps',
            span: 9,
            queries: [
              {
                expr: sumRate('infermesh_router_shadow_requests_total', sel(MODEL), ['model', 'shadow', 'outcome']),
                legend: '{{model}} v{{shadow}} {{outcome}}',
              },
              {
                expr: sumRate('infermesh_router_shadow_mismatched_outputs_total', sel(MODEL), SHADOW),
                legend: `mismatched: ${SHADOW_LEGEND}`,
              },
            ],
          }),
          timeSeries({
            title: 'Shadow output differences (p99)',
            description:
              'p99 per request of the relative L2 distance of the shadow’s floating-point outputs from the served ones, and of the largest absolute difference.',
            unit: 'short',
            queries: [
              {
                expr: quantile(0.99, 'infermesh_router_shadow_relative_l2', sel(MODEL), SHADOW),
                legend: `relative L2: ${SHADOW_LEGEND}`,
              },
              {
                expr: quantile(0.99, 'infermesh_router_shadow_max_abs_diff', sel(MODEL), SHADOW),
                legend: `max abs diff: ${SHADOW_LEGEND}`,
              },
            ],
          }),
          timeSeries({
            title: 'Shadow latency difference',
            description:
              'p50 and p99 of the shadow’s latency minus the served latency, per request: above 0 the shadow is slower.',
            unit: 's',
            queries: [
              {
                expr: quantile(0.5, 'infermesh_router_shadow_latency_diff_seconds', sel(MODEL), SHADOW),
                legend: `${SHADOW_LEGEND} p50`,
              },
              {
                expr: quantile(0.99, 'infermesh_router_shadow_latency_diff_seconds', sel(MODEL), SHADOW),
                legend: `${SHADOW_LEGEND} p99`,
              },
            ],
          }),
        ],
      },
      {
        title: 'Fallbacks and circuit breakers',
        panels: [
          timeSeries({
            title: 'Fallback rate',
            description:
              'Requests per second answered by the fallback model (marked degraded), by model, fallback and why the model could not answer.',
            unit: 'reqps',
            queries: [
              {
                expr: sumRate('infermesh_router_fallbacks_total', sel(MODEL), ['model', 'fallback', 'reason']),
                legend: '{{model}} → {{fallback}} ({{reason}})',
              },
            ],
          }),
          timeSeries({
            title: 'Fallback share',
            description: "The share of a model's requests at the router that its fallback model answered.",
            unit: 'percentunit',
            queries: [
              {
                expr: ratio(
                  sumRate('infermesh_router_fallbacks_total', sel(MODEL), ['model']),
                  sumRate('infermesh_router_requests_total', sel(MODEL), ['model']),
                ),
                legend: '{{model}}',
              },
            ],
          }),
          statPanel({
            title: 'Circuit state now',
            description:
              'The circuit breaker of each model version: closed (calls go through), half-open (a trial call goes through), open (calls are refused with CIRCUIT_OPEN). The worst across router replicas.',
            unit: 'short',
            span: 8,
            thresholds: [
              { value: null, color: 'green' },
              { value: 1, color: 'orange' },
              { value: 2, color: 'red' },
            ],
            mappings: CIRCUIT_STATES,
            queries: [
              {
                expr: 'max by (model, version) (infermesh_router_circuit_state{model=~"$model"})',
                legend: '{{model}} v{{version}}',
              },
            ],
          }),
          timeSeries({
            title: 'Circuit transitions',
            description: 'Circuit breaker changes of state per time step, by model version and the new state.',
            unit: 'short',
            span: 8,
            queries: [
              {
                expr: sumIncrease('infermesh_router_circuit_transitions_total', sel(MODEL), [
                  'model',
                  'version',
                  'state',
                ]),
                legend: '{{model}} v{{version}} → {{state}}',
              },
            ],
          }),
          timeSeries({
            title: 'Errors the breakers did not count',
            description:
              "Errors per second of a version's calls that its breaker did not count as the version's failures (the caller's deadline, a cancellation, bad input, a full queue), by status code.",
            unit: 'reqps',
            span: 8,
            queries: [
              {
                expr: sumRate('infermesh_router_circuit_not_counted_total', sel(MODEL), ['model', 'version', 'code']),
                legend: '{{model}} v{{version}} {{code}}',
              },
            ],
          }),
        ],
      },
    ],
  });
}
