import type { Span } from '@opentelemetry/api';
import * as prom from 'prom-client';
import { EVENT_LOOP_DELAY_METRICS, registerEventLoopDelay } from './event-loop-delay';
import { requestContext } from './request-context';
import { traceIdsOf } from './trace-ids';

/** Latency buckets in seconds, from 100 µs to 10 s. */
export const LATENCY_BUCKETS_SECONDS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

/**
 * The exposition formats: `prometheus` is the text format 0.0.4, what Prometheus scraped before it
 * asked for OpenMetrics and what tools that read only it expect; `openmetrics` (1.0.0) also carries
 * the exemplars and ends in `# EOF`.
 */
export type MetricsFormat = 'prometheus' | 'openmetrics';

export const METRICS_CONTENT_TYPES: Readonly<Record<MetricsFormat, string>> = {
  prometheus: prom.Registry.PROMETHEUS_CONTENT_TYPE,
  openmetrics: prom.Registry.OPENMETRICS_CONTENT_TYPE,
};

export interface HistogramOptions {
  /**
   * Keep, per bucket, the trace of the last sampled observation made with {@link Metrics.observe}, so
   * that a latency graph leads to a trace. Opt-in because prom-client then replaces the histogram's
   * `observe(labels, value)` with `observe({labels, value})` while its types still accept the old
   * form: an existing caller would compile and then throw at run time.
   */
  exemplars?: boolean;
}

/**
 * One service's Prometheus registry. Every metric of its own is named `infermesh_<service>_<what>_<unit>`;
 * the default process and Node.js metrics keep their standard names (`process_cpu_seconds_total`,
 * `nodejs_heap_size_used_bytes`, …) with a `service` label, so that standard Node dashboards and
 * alerts match them.
 */
export class Metrics {
  readonly registry = new prom.Registry();
  readonly prefix: string;

  constructor(readonly service: string) {
    this.prefix = `infermesh_${service}_`;
    // prom-client's event-loop delay figures read its monitor's resolution on an idle loop: they are
    // replaced by registerEventLoopDelay's, and its own monitor, whose figures are dropped, ticks once a second.
    prom.collectDefaultMetrics({ register: this.registry, labels: { service }, eventLoopMonitoringPrecision: 1_000 });
    for (const name of EVENT_LOOP_DELAY_METRICS) this.registry.removeSingleMetric(name);
    registerEventLoopDelay(this.registry, { service });
  }

  counter<L extends string>(name: string, help: string, labelNames: readonly L[] = []): prom.Counter<L> {
    return new prom.Counter({ name: this.prefix + name, help, labelNames, registers: [this.registry] });
  }

  /** A gauge; `collect`, when given, sets its values each time the metrics are scraped. */
  gauge<L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[] = [],
    collect?: (gauge: prom.Gauge<L>) => void,
  ): prom.Gauge<L> {
    return new prom.Gauge({
      name: this.prefix + name,
      help,
      labelNames,
      registers: [this.registry],
      ...(collect !== undefined && {
        collect(this: prom.Gauge<L>) {
          collect(this);
        },
      }),
    });
  }

  /** A histogram; one with `exemplars` is to be observed with {@link observe} only. */
  histogram<L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[] = [],
    buckets: number[] = LATENCY_BUCKETS_SECONDS,
    options: HistogramOptions = {},
  ): prom.Histogram<L> {
    const exemplars = options.exemplars === true;
    const histogram = new prom.Histogram({
      name: this.prefix + name,
      help,
      labelNames,
      buckets,
      // prom-client refuses an exemplar metric in a registry of the Prometheus format; this one is
      // also rendered in OpenMetrics (see render), so it is registered past that check.
      registers: exemplars ? [] : [this.registry],
      enableExemplars: exemplars,
    });
    if (exemplars) this.registry.registerMetric(histogram);
    return histogram;
  }

  /**
   * Observes a value; on a histogram made with `exemplars`, inside a sampled trace, the observation
   * becomes its bucket's exemplar with the span's `trace_id` and `span_id`. An unsampled trace was
   * not exported, so an exemplar would lead nowhere: its observation keeps the bucket's last one.
   */
  observe<L extends string>(
    histogram: prom.Histogram<L>,
    labels: prom.LabelValues<L>,
    value: number,
    span: Span | undefined = requestContext.current()?.span,
  ): void {
    if (!(histogram as { enableExemplars?: boolean }).enableExemplars) {
      histogram.observe(labels, value);
      return;
    }
    const ids = traceIdsOf(span);
    const exemplarLabels = ids?.sampled === true ? { trace_id: ids.traceId, span_id: ids.spanId } : {};
    // prom-client types exemplar labels as the histogram's own label names; they are free-form.
    histogram.observe({ labels, value, exemplarLabels: exemplarLabels as prom.LabelValues<L> });
  }

  /** The metrics as text in the given format; `METRICS_CONTENT_TYPES[format]` is its content type. */
  async render(format: MetricsFormat = 'prometheus'): Promise<string> {
    if (format === 'prometheus') return this.registry.metrics();
    // prom-client renders OpenMetrics from a registry whose content type says so, and in doing so
    // renames every counter it holds in place (`x_total` to `x`), which would take `_total` off the
    // counters in the next Prometheus-format scrape. So each scrape renders into a registry of its
    // own holding views that read the same metrics, named as OpenMetrics names them: concurrent
    // scrapes in either format share no state but the metrics' values.
    const openMetrics = new prom.Registry<prom.OpenMetricsContentType>();
    openMetrics.setContentType(prom.Registry.OPENMETRICS_CONTENT_TYPE);
    for (const metric of this.registry.getMetricsAsArray())
      openMetrics.registerMetric(openMetricsView(metric as unknown as RenderedMetric));
    return openMetrics.metrics();
  }
}

/**
 * What a registry reads of a metric to render it; prom-client's types leave the reading out of
 * getMetricsAsArray and declare `type` a numeric enum where it is a string at run time.
 */
interface RenderedMetric {
  readonly name: string;
  readonly type: string;
  get(): Promise<{ name: string }>;
  /** A histogram's: its labels as the Prometheus format writes them, where get() would reorder them. */
  getForPromString?(): Promise<{ name: string }>;
}

/**
 * A metric as OpenMetrics names its family: a counter without its `_total`, which the registry adds
 * back to each sample.
 */
function openMetricsView(metric: RenderedMetric): prom.Metric {
  const name = metric.type === 'counter' ? metric.name.replace(/_total$/, '') : metric.name;
  const view: RenderedMetric = {
    name,
    type: metric.type,
    async get() {
      const data = await (metric.getForPromString !== undefined ? metric.getForPromString() : metric.get());
      return { ...data, name };
    },
  };
  return view as unknown as prom.Metric;
}
