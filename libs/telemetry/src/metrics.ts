import * as prom from 'prom-client';

/** Latency buckets in seconds, from 100 µs to 10 s. */
export const LATENCY_BUCKETS_SECONDS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

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
    // The event-loop delay monitor samples every 100 ms instead of prom-client's 10 ms: an idle
    // service should not wake up a hundred times a second.
    prom.collectDefaultMetrics({ register: this.registry, labels: { service }, eventLoopMonitoringPrecision: 100 });
  }

  counter<L extends string>(name: string, help: string, labelNames: readonly L[] = []): prom.Counter<L> {
    return new prom.Counter({ name: this.prefix + name, help, labelNames, registers: [this.registry] });
  }

  /** A gauge; `collect`, when given, sets its values each time the metrics are scraped. */
  gauge<L extends string>(name: string, help: string, labelNames: readonly L[] = [], collect?: (gauge: prom.Gauge<L>) => void): prom.Gauge<L> {
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

  histogram<L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[] = [],
    buckets: number[] = LATENCY_BUCKETS_SECONDS,
  ): prom.Histogram<L> {
    return new prom.Histogram({ name: this.prefix + name, help, labelNames, buckets, registers: [this.registry] });
  }

  async render(): Promise<string> {
    return this.registry.metrics();
  }
}
