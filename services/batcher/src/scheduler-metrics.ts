import { Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { RegistryWatch } from '@infermesh/registry-watch';
import { LATENCY_BUCKETS_SECONDS, Metrics, ModelLabels } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import type { Counter, Gauge, Histogram } from 'prom-client';
import { type VersionQueue, VersionQueues } from './version-queues';

/** Why a request was answered without reaching a worker: the `reason` label of rejections_total. */
export type Rejection =
  'QUEUE_FULL' | 'DEADLINE_INFEASIBLE' | 'DEADLINE_EXCEEDED' | 'CANCELLED' | 'MODEL_NOT_READY' | 'INVALID_PRIORITY';

/** The `model` and `version` labels of a model version, as ModelLabels gives them. */
export type VersionLabels = { model: string; version: string };

/**
 * The scheduler's instruments (infermesh_batcher_*): queue depth and age per version, rejections by
 * reason, dispatches by outcome, retries, queue time, batch size and dispatch duration. Dashboards,
 * alert rules and the e2e tests read them by these names, labels and help texts.
 *
 * A model version is a label value when the registry watch holds it or a worker has it (its queue
 * exists only then); any other name is "(unknown)", so that clients cannot grow the label sets.
 */
@Injectable()
export class SchedulerMetrics {
  private readonly labels: ModelLabels;
  private readonly rejections: Counter<'model' | 'reason'>;
  private readonly dispatched: Counter<'model' | 'version' | 'outcome'>;
  private readonly retries: Counter<'model'>;
  private readonly queueTime: Histogram<'model' | 'version'>;
  private readonly batchSize: Histogram<'model' | 'version'>;
  private readonly duration: Histogram<'model' | 'version'>;

  constructor(
    private readonly metrics: Metrics,
    watch: RegistryWatch,
    private readonly queues: VersionQueues,
    private readonly clock: Clock,
  ) {
    this.labels = new ModelLabels({
      hasModel: (model) => watch.hasModel(model) || queues.hasModel(model),
      hasVersion: (model, version) =>
        watch.hasVersion(model, version) || queues.has(`models/${model}/versions/${version}`),
    });
    metrics.gauge(
      'queue_depth',
      'Requests waiting in the queue of each model version.',
      ['model', 'version'],
      this.perQueue(
        (q) => q.length,
        (a, b) => a + b,
      ),
    );
    metrics.gauge(
      'queue_oldest_age_seconds',
      'How long the oldest request in the queue of each model version has waited: the autoscaling signal.',
      ['model', 'version'],
      this.perQueue((q) => {
        const oldest = q.oldest();
        return oldest === undefined ? 0 : (this.clock.monotonic() - oldest.arrivedAtMs) / 1000;
      }, Math.max),
    );
    this.rejections = metrics.counter(
      'rejections_total',
      'Requests answered without reaching a worker, by model and reason.',
      ['model', 'reason'],
    );
    this.dispatched = metrics.counter(
      'dispatched_total',
      'Requests answered after a worker ran them, by model, version and outcome.',
      ['model', 'version', 'outcome'],
    );
    this.retries = metrics.counter(
      'retries_total',
      'Batches sent again to another worker after their worker was unavailable.',
      ['model'],
    );
    this.queueTime = metrics.histogram(
      'queue_time_seconds',
      'Time from arrival until a request leaves the queue in a batch.',
      ['model', 'version'],
    );
    this.batchSize = metrics.histogram(
      'batch_size',
      'Items per batch sent to workers.',
      ['model', 'version'],
      [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    );
    this.duration = metrics.histogram(
      'dispatch_duration_seconds',
      'Time from arrival to a worker answer.',
      ['model', 'version'],
      LATENCY_BUCKETS_SECONDS,
      { exemplars: true },
    );
  }

  /** The labels of a version's queue now (a batch keeps those it was sent with until it is answered). */
  labelsOf(queue: VersionQueue): VersionLabels {
    return this.labels.of(queue.model, queue.version);
  }

  /** A request of the model answered without reaching a worker. */
  rejected(model: string, reason: Rejection): void {
    this.rejections.inc({ model: this.labels.model(model), reason });
  }

  /** A batch of the model sent again to another worker. */
  retried(model: string): void {
    this.retries.inc({ model: this.labels.model(model) });
  }

  /** A request left its queue in a batch after waiting this long. */
  leftQueue(labels: VersionLabels, waitedSeconds: number): void {
    this.queueTime.observe(labels, waitedSeconds);
  }

  /** A batch of this many items went to a worker. */
  batchSent(labels: VersionLabels, items: number): void {
    this.batchSize.observe(labels, items);
  }

  /** A request answered with its worker's response, this long after it arrived. */
  answered(labels: VersionLabels, sinceArrivalSeconds: number, span: Span | undefined): void {
    this.dispatched.inc({ ...labels, outcome: 'ok' });
    this.metrics.observe(this.duration, labels, sinceArrivalSeconds, span);
  }

  /** A request whose batch failed. */
  failed(labels: VersionLabels): void {
    this.dispatched.inc({ ...labels, outcome: 'error' });
  }

  /** Queues whose version the registry no longer has share the "(unknown)" labels: depths add up, ages take the oldest. */
  private perQueue(value: (queue: VersionQueue) => number, combine: (a: number, b: number) => number) {
    return (gauge: Gauge<'model' | 'version'>) => {
      gauge.reset();
      const values = new Map<string, { labels: VersionLabels; value: number }>();
      for (const queue of this.queues) {
        const labels = this.labelsOf(queue);
        const key = `${labels.model}\u0000${labels.version}`;
        const known = values.get(key);
        values.set(key, { labels, value: known === undefined ? value(queue) : combine(known.value, value(queue)) });
      }
      for (const { labels, value: v } of values.values()) gauge.set(labels, v);
    };
  }
}
