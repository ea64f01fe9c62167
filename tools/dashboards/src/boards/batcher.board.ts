import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, heatmapPanel, labelVariable, statPanel, timeSeries } from '../panels';
import { INSTANCE, mean, MODEL, quantile, sel, sumIncrease, sumRate } from '../promql';

const M = sel(MODEL, INSTANCE);
const VERSION = ['model', 'version'];
const PER_VERSION = '{{model}} v{{version}}';

export function batcherBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-batcher',
    title: 'infermesh / Batcher',
    description:
      "The batcher's queues (one per model version), the batches it forms, what it answers, its retries, and the outlier detection of its edge to the workers.",
    tags: ['batcher'],
    variables: [
      labelVariable(
        'model',
        'Model',
        'Models the batcher has queued or answered.',
        'label_values(infermesh_batcher_dispatched_total, model)',
      ),
      labelVariable('instance', 'Instance', 'Batcher replicas.', 'label_values(up{job="infermesh-batcher"}, instance)'),
    ],
    rows: [
      {
        title: 'Queues',
        panels: [
          timeSeries({
            title: 'Queue depth per version',
            description: 'Requests waiting in the queue of each model version, all selected replicas together.',
            unit: 'short',
            queries: [{ expr: `sum by (model, version) (infermesh_batcher_queue_depth${M})`, legend: PER_VERSION }],
          }),
          timeSeries({
            title: 'Oldest request age per version',
            description:
              'How long the oldest waiting request of each model version has waited (the autoscaling signal), the largest across replicas.',
            unit: 's',
            queries: [
              { expr: `max by (model, version) (infermesh_batcher_queue_oldest_age_seconds${M})`, legend: PER_VERSION },
            ],
          }),
          timeSeries({
            title: 'Queue wait per version',
            description: 'p50 and p99 of the time from arrival until a request leaves its queue in a batch.',
            unit: 's',
            queries: [
              { expr: quantile(0.5, 'infermesh_batcher_queue_time_seconds', M, VERSION), legend: `${PER_VERSION} p50` },
              {
                expr: quantile(0.99, 'infermesh_batcher_queue_time_seconds', M, VERSION),
                legend: `${PER_VERSION} p99`,
              },
            ],
          }),
          heatmapPanel({
            title: 'Queue wait distribution',
            description:
              'How many requests left their queue after each wait, per time step (queue_time_seconds buckets), selected models together.',
            unit: 's',
            query: { expr: sumIncrease('infermesh_batcher_queue_time_seconds_bucket', M, ['le']) },
          }),
        ],
      },
      {
        title: 'Batches',
        panels: [
          heatmapPanel({
            title: 'Batch size distribution',
            description:
              'How many batches of each size (items per batch sent to a worker) the batcher formed per time step, selected models together.',
            unit: 'short',
            query: { expr: sumIncrease('infermesh_batcher_batch_size_bucket', M, ['le']) },
          }),
          timeSeries({
            title: 'Mean batch size per version',
            description: 'Mean items per batch sent to workers, per model version.',
            unit: 'short',
            queries: [{ expr: mean('infermesh_batcher_batch_size', M, VERSION), legend: PER_VERSION }],
          }),
          timeSeries({
            title: 'Batches per second per version',
            description: 'Batches sent to workers per second, per model version.',
            unit: 'ops',
            queries: [{ expr: sumRate('infermesh_batcher_batch_size_count', M, VERSION), legend: PER_VERSION }],
          }),
          timeSeries({
            title: 'Arrival to worker answer per version',
            description:
              'p50 and p99 of the time from a request’s arrival at the batcher to its worker’s answer (queue wait included).',
            unit: 's',
            queries: [
              {
                expr: quantile(0.5, 'infermesh_batcher_dispatch_duration_seconds', M, VERSION),
                legend: `${PER_VERSION} p50`,
              },
              {
                expr: quantile(0.99, 'infermesh_batcher_dispatch_duration_seconds', M, VERSION),
                legend: `${PER_VERSION} p99`,
              },
            ],
          }),
        ],
      },
      {
        title: 'Outcomes and retries',
        panels: [
          timeSeries({
            title: 'Answered requests by outcome',
            description: 'Requests per second answered after a worker ran them, by outcome.',
            unit: 'reqps',
            span: 8,
            stack: true,
            queries: [{ expr: sumRate('infermesh_batcher_dispatched_total', M, ['outcome']), legend: '{{outcome}}' }],
          }),
          timeSeries({
            title: 'Rejections by reason',
            description:
              'Requests per second answered without reaching a worker (a full queue, no worker, a deadline that cannot be met, …), by model and reason.',
            unit: 'reqps',
            span: 8,
            queries: [
              {
                expr: sumRate('infermesh_batcher_rejections_total', M, ['model', 'reason']),
                legend: '{{model}} {{reason}}',
              },
            ],
          }),
          timeSeries({
            title: 'Retries',
            description:
              'Batches per second the batcher sent again to another worker after theirs was unavailable, and requests per second the router sent again to the batcher after an UNAVAILABLE answer.',
            unit: 'ops',
            span: 8,
            queries: [
              {
                expr: sumRate('infermesh_batcher_retries_total', M, ['model']),
                legend: 'batcher → another worker: {{model}}',
              },
              {
                expr: sumRate('infermesh_router_batcher_retries_total', sel(MODEL), ['model']),
                legend: 'router → batcher: {{model}}',
              },
            ],
          }),
        ],
      },
      {
        title: 'Workers (outlier detection)',
        panels: [
          statPanel({
            title: 'Workers ejected now',
            description:
              'Workers that the outlier detection of the batcher → worker edge has ejected now, per batcher replica (each ejects on its own view).',
            unit: 'short',
            span: 6,
            thresholds: [
              { value: null, color: 'green' },
              { value: 1, color: 'orange' },
            ],
            queries: [
              {
                expr: 'sum by (instance) (infermesh_batcher_workers_ejected{instance=~"$instance"})',
                legend: '{{instance}}',
              },
            ],
          }),
          timeSeries({
            title: 'Workers reachable and ejected',
            description:
              'Per batcher replica: the workers that answered its last poll, and those its outlier detection ejected.',
            unit: 'short',
            span: 9,
            queries: [
              {
                expr: 'sum by (instance) (infermesh_batcher_workers_reachable{instance=~"$instance"})',
                legend: 'reachable · {{instance}}',
              },
              {
                expr: 'sum by (instance) (infermesh_batcher_workers_ejected{instance=~"$instance"})',
                legend: 'ejected · {{instance}}',
              },
            ],
          }),
          timeSeries({
            title: 'Worker ejections',
            description: 'Ejections of workers by the outlier detection per time step, per batcher replica.',
            unit: 'short',
            span: 9,
            queries: [
              {
                expr: sumIncrease('infermesh_batcher_worker_ejections_total', sel(INSTANCE), ['instance']),
                legend: '{{instance}}',
              },
            ],
          }),
        ],
      },
    ],
  });
}
