// PromQL building blocks shared by the boards. Every metric is named `infermesh_<service>_<name>`
// (libs/telemetry/src/metrics.ts); Prometheus adds `job` (infermesh-<service>) and `instance`.

export const SERVICES = ['gateway', 'registry', 'router', 'batcher', 'worker', 'cache'] as const;
export type Service = (typeof SERVICES)[number];

/** The full name of one service's metric. */
export function metric(service: Service, name: string): string {
  return `infermesh_${service}_${name}`;
}

/** The window of the boards' rates: Grafana's, at least four scrape intervals. */
export const RATE = '$__rate_interval';
/** The board's whole time range, for stats that sum it up. */
export const RANGE = '$__range';

/** A label selector from matchers, e.g. `sel('model=~"$model"', 'code!="OK"')` → `{model=~"$model", code!="OK"}`. */
export function sel(...matchers: string[]): string {
  return matchers.length === 0 ? '' : `{${matchers.join(', ')}}`;
}

export const MODEL = 'model=~"$model"';
export const INSTANCE = 'instance=~"$instance"';

function by(labels: readonly string[]): string {
  return labels.length === 0 ? '' : ` by (${labels.join(', ')})`;
}

/** `sum by (labels) (rate(name{…}[window]))`. */
export function sumRate(name: string, selector: string, labels: readonly string[] = [], window = RATE): string {
  return `sum${by(labels)} (rate(${name}${selector}[${window}]))`;
}

/** `sum by (labels) (increase(name{…}[window]))`: how many in each step (or over the range). */
export function sumIncrease(name: string, selector: string, labels: readonly string[] = [], window = RATE): string {
  return `sum${by(labels)} (increase(${name}${selector}[${window}]))`;
}

/** A quantile of a histogram (named without `_bucket`), by the labels given. */
export function quantile(
  q: number,
  histogram: string,
  selector: string,
  labels: readonly string[] = [],
  window = RATE,
): string {
  return `histogram_quantile(${q}, sum by (${[...labels, 'le'].join(', ')}) (rate(${histogram}_bucket${selector}[${window}])))`;
}

/** The mean of a histogram's observations, by the labels given. */
export function mean(histogram: string, selector: string, labels: readonly string[] = [], window = RATE): string {
  return `${sumRate(`${histogram}_sum`, selector, labels, window)} / ${sumRate(`${histogram}_count`, selector, labels, window)}`;
}

/**
 * numerator / denominator, where both are aggregated by the same labels, and a missing numerator
 * series (no error was ever counted) reads as 0 instead of hiding the ratio.
 */
export function ratio(numerator: string, denominator: string): string {
  return `(${numerator} or ${denominator} * 0) / ${denominator}`;
}

/** Alternation of exact values for a regex matcher. */
export function oneOf(values: readonly string[]): string {
  return values.join('|');
}

/**
 * gRPC methods whose calls are long-lived streams (health and registry watches, mesh announcements,
 * server reflection, the streams carrying cache lookups): their durations are stream lifetimes, so
 * latency panels leave them out (the lookups they carry are recorded as CacheService/Lookup).
 */
export const STREAMING_METHODS = 'method!~".+/(Watch|WatchModels|Announce|ServerReflectionInfo|Lookups)"';

/** gRPC status codes (the `code` label of grpc_server_handling_seconds) that are the server's fault. */
export const GRPC_SERVER_ERROR_CODES = [
  'UNKNOWN',
  'DEADLINE_EXCEEDED',
  'INTERNAL',
  'UNAVAILABLE',
  'DATA_LOSS',
  'UNIMPLEMENTED',
];
