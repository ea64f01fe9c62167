import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, gaugePanel, labelVariable, statPanel, timeSeries } from '../panels';
import { INSTANCE, MODEL, quantile, RANGE, ratio, sel, sumRate } from '../promql';

const ROUTER_CACHE = 'infermesh_router_cache_requests_total';
const LOOKUPS = 'infermesh_cache_lookups_total';
const SKIPPED = 'infermesh_router_cache_lookups_skipped_total';
const I = sel(INSTANCE);

/** Requests served from a cache (the router's own or the shared one) among those that could be. */
const routerHitRatio = (window?: string) =>
  ratio(
    sumRate(ROUTER_CACHE, sel('outcome=~"local_hit|hit"'), [], window),
    sumRate(ROUTER_CACHE, sel('outcome!="disabled"'), [], window),
  );

export function cacheBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-cache',
    title: 'infermesh / Cache',
    description:
      "The result cache: how often the router answers from it (its own in-process cache, then the shared cache service), how fast, and how full the cache service's store is.",
    tags: ['cache'],
    variables: [
      labelVariable(
        'model',
        'Model',
        'Models the router has served.',
        'label_values(infermesh_router_request_duration_seconds_count, model)',
      ),
      labelVariable(
        'instance',
        'Instance',
        'Cache service replicas.',
        'label_values(up{job="infermesh-cache"}, instance)',
      ),
    ],
    rows: [
      {
        title: 'Hit ratio',
        panels: [
          statPanel({
            title: 'Hit ratio over the range',
            description:
              "The share of the router's cache uses answered from a cache (its own or the shared one) over the whole time range; models whose cache policy is off are left out.",
            unit: 'percentunit',
            decimals: 1,
            span: 6,
            queries: [{ expr: routerHitRatio(RANGE), legend: 'router' }],
          }),
          timeSeries({
            title: 'Hit ratio',
            description:
              "Router: the share of its cache uses (local_hit, hit, miss, bypass, coalesced) answered from a cache, and from its own in-process cache alone. Cache service: the share of the lookups it was asked that found the entry; routers do not ask about keys its filter of held keys lacks, so this share runs above the router's.",
            unit: 'percentunit',
            span: 9,
            max: 1,
            queries: [
              { expr: routerHitRatio(), legend: 'router: any cache' },
              {
                expr: ratio(
                  sumRate(ROUTER_CACHE, sel('outcome="local_hit"')),
                  sumRate(ROUTER_CACHE, sel('outcome!="disabled"')),
                ),
                legend: 'router: its own cache',
              },
              {
                expr: ratio(sumRate(LOOKUPS, sel(INSTANCE, 'outcome="hit"')), sumRate(LOOKUPS, I)),
                legend: 'cache service lookups',
              },
            ],
          }),
          timeSeries({
            title: 'Answered from cache per model',
            description:
              "The share of each model's served requests the router answered from a cache (its request_duration_seconds, label cached).",
            unit: 'percentunit',
            span: 9,
            max: 1,
            queries: [
              {
                expr: ratio(
                  sumRate('infermesh_router_request_duration_seconds_count', sel(MODEL, 'cached="true"'), ['model']),
                  sumRate('infermesh_router_request_duration_seconds_count', sel(MODEL), ['model']),
                ),
                legend: '{{model}}',
              },
            ],
          }),
          timeSeries({
            title: 'Router cache use by outcome',
            description:
              "The router's cache uses per second: local_hit (its own cache), hit (the shared cache), miss, bypass (the cache failed or was slow), coalesced (joined an identical miss in flight), disabled.",
            unit: 'reqps',
            span: 24,
            stack: true,
            queries: [{ expr: sumRate(ROUTER_CACHE, '', ['outcome']), legend: '{{outcome}}' }],
          }),
        ],
      },
      {
        title: 'Cache service',
        panels: [
          timeSeries({
            title: 'Lookups by outcome',
            description:
              "Lookups per second the cache service answered, by outcome (hit, miss, error), and the misses the routers did not ask about because the cache's filter of held keys lacked the key (all routers).",
            unit: 'reqps',
            span: 6,
            stack: true,
            queries: [
              { expr: sumRate(LOOKUPS, I, ['outcome']), legend: '{{outcome}}' },
              { expr: sumRate(SKIPPED, ''), legend: 'miss not asked (routers)' },
            ],
          }),
          timeSeries({
            title: 'Stores by outcome',
            description: 'Stores per second by outcome (stored, too_large, error).',
            unit: 'reqps',
            span: 6,
            stack: true,
            queries: [{ expr: sumRate('infermesh_cache_stores_total', I, ['outcome']), legend: '{{outcome}}' }],
          }),
          timeSeries({
            title: 'Lookup latency (cache service)',
            description: 'p50 and p99 of the time the cache service took to look up an entry, by outcome.',
            unit: 's',
            span: 6,
            queries: [
              {
                expr: quantile(0.5, 'infermesh_cache_lookup_duration_seconds', I, ['outcome']),
                legend: '{{outcome}} p50',
              },
              {
                expr: quantile(0.99, 'infermesh_cache_lookup_duration_seconds', I, ['outcome']),
                legend: '{{outcome}} p99',
              },
            ],
          }),
          timeSeries({
            title: 'Time to answer from the shared cache (router)',
            description:
              'p50 and p99 of the time the router took to answer a request from the shared cache: its lookup, network included.',
            unit: 's',
            span: 6,
            queries: [
              { expr: quantile(0.5, 'infermesh_router_cache_hit_seconds', ''), legend: 'p50' },
              { expr: quantile(0.99, 'infermesh_router_cache_hit_seconds', ''), legend: 'p99' },
            ],
          }),
        ],
      },
      {
        title: 'Size',
        panels: [
          gaugePanel({
            title: 'Store budget used',
            description:
              'Bytes charged to the results each cache replica holds (values, keys and per-entry overhead), as a share of CACHE_MAX_BYTES.',
            unit: 'percentunit',
            span: 6,
            min: 0,
            max: 1,
            thresholds: [
              { value: null, color: 'green' },
              { value: 0.9, color: 'orange' },
            ],
            queries: [
              {
                expr: `sum by (instance) (infermesh_cache_store_bytes${I}) / sum by (instance) (infermesh_cache_store_budget_bytes${I})`,
                legend: '{{instance}}',
              },
            ],
          }),
          timeSeries({
            title: 'Store size and budget',
            description: 'Bytes charged to the results each cache replica holds, and its budget (CACHE_MAX_BYTES).',
            unit: 'bytes',
            span: 9,
            queries: [
              { expr: `sum by (instance) (infermesh_cache_store_bytes${I})`, legend: '{{instance}}' },
              { expr: `sum by (instance) (infermesh_cache_store_budget_bytes${I})`, legend: 'budget · {{instance}}' },
            ],
          }),
          timeSeries({
            title: "Router's own cache size",
            description: "Bytes held by each router replica's in-process result cache.",
            unit: 'bytes',
            span: 9,
            queries: [{ expr: 'sum by (instance) (infermesh_router_local_cache_bytes)', legend: '{{instance}}' }],
          }),
        ],
      },
    ],
  });
}
