import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, gaugePanel, heatmapPanel, labelVariable, timeSeries } from '../panels';
import { INSTANCE, mean, MODEL, quantile, sel, sumIncrease, sumRate } from '../promql';

const M = sel(MODEL, INSTANCE);
const I = sel(INSTANCE);
const COMPUTE = 'infermesh_worker_inference_compute_seconds';
const PER_VERSION = '{{model}} v{{version}}';

export function workerBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-worker',
    title: 'infermesh / Worker',
    description:
      'What the workers run and how fast, by batch size; the memory their loaded model versions are charged against the budget; loads, unloads and evictions; GPUs.',
    tags: ['worker'],
    variables: [
      labelVariable('model', 'Model', 'Models the workers have run.', `label_values(${COMPUTE}_count, model)`),
      labelVariable('instance', 'Instance', 'Worker replicas.', 'label_values(up{job="infermesh-worker"}, instance)'),
    ],
    rows: [
      {
        title: 'Executions',
        panels: [
          timeSeries({
            title: 'Executions per model version',
            description: 'Requests per second the workers computed, per model version and execution provider.',
            unit: 'reqps',
            span: 8,
            queries: [
              {
                expr: sumRate(`${COMPUTE}_count`, M, ['model', 'version', 'device']),
                legend: `${PER_VERSION} {{device}}`,
              },
            ],
          }),
          timeSeries({
            title: 'Failures by reason',
            description:
              'Requests per second the workers refused or failed, by ErrorInfo reason (this counter has no model label).',
            unit: 'reqps',
            span: 8,
            queries: [
              { expr: sumRate('infermesh_worker_inference_failures_total', I, ['reason']), legend: '{{reason}}' },
            ],
          }),
          timeSeries({
            title: 'Requests in flight',
            description: 'Requests each worker is handling now, loading their model included.',
            unit: 'short',
            span: 8,
            queries: [
              { expr: `sum by (instance) (infermesh_worker_inference_requests_in_flight${I})`, legend: '{{instance}}' },
            ],
          }),
          timeSeries({
            title: 'Compute latency per model version',
            description:
              'p50 and p99 of the time a model version computes one request (one batch) on its execution instance, by execution provider.',
            unit: 's',
            span: 24,
            queries: [
              {
                expr: quantile(0.5, COMPUTE, M, ['model', 'version', 'device']),
                legend: `${PER_VERSION} {{device}} p50`,
              },
              {
                expr: quantile(0.99, COMPUTE, M, ['model', 'version', 'device']),
                legend: `${PER_VERSION} {{device}} p99`,
              },
            ],
          }),
        ],
      },
      {
        title: 'Latency and batch size',
        panels: [
          heatmapPanel({
            title: 'Batch size distribution (worker)',
            description:
              'How many requests of each batch size (first dimension) the workers ran per time step, selected models together.',
            unit: 'short',
            span: 8,
            query: { expr: sumIncrease('infermesh_worker_inference_batch_size_bucket', M, ['le']) },
          }),
          timeSeries({
            title: 'Compute time per batch item',
            description:
              'Compute seconds divided by the batch items computed, per model version: flat as batches grow when batching pays off. (The compute histogram has no batch-size label, so latency is not split by batch size.)',
            unit: 's',
            span: 8,
            queries: [
              {
                expr: `${sumRate(`${COMPUTE}_sum`, M, ['model', 'version'])} / ${sumRate('infermesh_worker_inference_batch_size_sum', M, ['model', 'version'])}`,
                legend: PER_VERSION,
              },
            ],
          }),
          timeSeries({
            title: 'Mean batch size and mean compute time',
            description:
              'Per model version, the mean batch size a worker ran (left axis) beside the mean compute time of a request (right axis): how latency follows batch size.',
            unit: 'short',
            span: 8,
            queries: [
              {
                expr: mean('infermesh_worker_inference_batch_size', M, ['model', 'version']),
                legend: `${PER_VERSION} batch size`,
              },
              { expr: mean(COMPUTE, M, ['model', 'version']), legend: `${PER_VERSION} compute` },
            ],
          }).overrideByQuery('B', [
            { id: 'unit', value: 's' },
            { id: 'custom.axisPlacement', value: 'right' },
          ]),
        ],
      },
      {
        title: 'Memory',
        panels: [
          gaugePanel({
            title: 'Memory budget used',
            description: 'Memory the loaded model versions are charged, as a share of the memory budget, per worker.',
            unit: 'percentunit',
            span: 8,
            min: 0,
            max: 1,
            thresholds: [
              { value: null, color: 'green' },
              { value: 0.8, color: 'orange' },
              { value: 0.95, color: 'red' },
            ],
            queries: [
              {
                expr: `sum by (instance) (infermesh_worker_models_loaded_bytes${I}) / sum by (instance) (infermesh_worker_memory_budget_bytes${I})`,
                legend: '{{instance}}',
              },
            ],
          }),
          timeSeries({
            title: 'Loaded model memory and budget',
            description:
              'Memory the loaded model versions are charged, per worker and execution provider, and each worker’s budget.',
            unit: 'bytes',
            span: 8,
            queries: [
              {
                expr: `sum by (instance, device) (infermesh_worker_models_loaded_bytes${I})`,
                legend: '{{instance}} {{device}}',
              },
              { expr: `sum by (instance) (infermesh_worker_memory_budget_bytes${I})`, legend: 'budget · {{instance}}' },
            ],
          }),
          timeSeries({
            title: 'Model versions loaded',
            description: 'Model versions loaded and READY, per worker and execution provider.',
            unit: 'short',
            span: 8,
            queries: [
              {
                expr: `sum by (instance, device) (infermesh_worker_models_loaded${I})`,
                legend: '{{instance}} {{device}}',
              },
            ],
          }),
        ],
      },
      {
        title: 'Loads and evictions',
        panels: [
          timeSeries({
            title: 'Loads by outcome',
            description:
              'Model version loads per time step by outcome: ready, failed, no_room (the budget had no room), interrupted.',
            unit: 'short',
            span: 8,
            queries: [
              { expr: sumIncrease('infermesh_worker_model_loads_total', I, ['outcome']), legend: '{{outcome}}' },
            ],
          }),
          timeSeries({
            title: 'Load duration',
            description:
              'p50 and p99 of the time to download, verify, load and warm up a model version, loads that ended READY.',
            unit: 's',
            span: 8,
            queries: [
              {
                expr: quantile(
                  0.5,
                  'infermesh_worker_model_load_duration_seconds',
                  sel(MODEL, INSTANCE, 'outcome="ready"'),
                  ['model'],
                ),
                legend: '{{model}} p50',
              },
              {
                expr: quantile(
                  0.99,
                  'infermesh_worker_model_load_duration_seconds',
                  sel(MODEL, INSTANCE, 'outcome="ready"'),
                  ['model'],
                ),
                legend: '{{model}} p99',
              },
            ],
          }),
          timeSeries({
            title: 'Evictions and unloads',
            description:
              'Idle model versions evicted to make room for another, per model; and all unloads by reason (evicted, requested, retired, shutdown), per time step.',
            unit: 'short',
            span: 8,
            queries: [
              {
                expr: sumIncrease('infermesh_worker_model_evictions_total', M, ['model']),
                legend: 'evicted: {{model}}',
              },
              {
                expr: sumIncrease('infermesh_worker_model_unloads_total', I, ['reason']),
                legend: 'unloaded: {{reason}}',
              },
            ],
          }),
          timeSeries({
            title: 'Worker faults',
            description:
              'Per time step: artifacts refused because their SHA-256 did not match the registry’s, local artifact copies deleted to keep the cache within WORKER_ARTIFACT_CACHE_BYTES, execution threads that died or failed to restart, and registry syncs that failed.',
            unit: 'short',
            span: 24,
            queries: [
              {
                expr: sumIncrease('infermesh_worker_artifact_verification_failures_total', M, ['model']),
                legend: 'artifact verification failed: {{model}}',
              },
              {
                expr: sumIncrease('infermesh_worker_artifact_cache_evictions_total', I),
                legend: 'artifact cache evictions',
              },
              {
                expr: sumIncrease('infermesh_worker_execution_thread_failures_total', I),
                legend: 'execution thread failures',
              },
              {
                expr: sumIncrease('infermesh_worker_registry_sync_failures_total', I),
                legend: 'registry sync failures',
              },
            ],
          }),
        ],
      },
      {
        title: 'GPUs (nvidia-smi, workers that have one)',
        panels: [
          timeSeries({
            title: 'GPU utilisation',
            description: 'GPU utilisation over the last sample period, per worker and GPU (nvidia-smi).',
            unit: 'percentunit',
            min: 0,
            max: 1,
            queries: [
              {
                expr: `max by (instance, gpu, name) (infermesh_worker_gpu_utilization_ratio${I})`,
                legend: '{{instance}} GPU {{gpu}} {{name}}',
              },
            ],
          }),
          timeSeries({
            title: 'GPU memory',
            description: 'GPU memory in use and in all, per worker and GPU (nvidia-smi).',
            unit: 'bytes',
            queries: [
              {
                expr: `max by (instance, gpu) (infermesh_worker_gpu_memory_used_bytes${I})`,
                legend: 'used · {{instance}} GPU {{gpu}}',
              },
              {
                expr: `max by (instance, gpu) (infermesh_worker_gpu_memory_total_bytes${I})`,
                legend: 'total · {{instance}} GPU {{gpu}}',
              },
            ],
          }),
        ],
      },
    ],
  });
}
