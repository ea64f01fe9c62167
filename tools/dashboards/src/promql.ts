// PromQL building blocks shared by the boards. Every metric is named `infermesh_<service>_<name>`
// (libs/telemetry/src/metrics.ts); Prometheus adds `job` (infermesh-<service>) and `instance`.

import type { DescService } from '@bufbuild/protobuf';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { ServerReflection } from '@infermesh/proto/gen/grpc/reflection/v1/reflection_pb';
import { ServerReflection as ServerReflectionV1Alpha } from '@infermesh/proto/gen/grpc/reflection/v1alpha/reflection_pb';
import { GRPCInferenceService } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';

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

/** The gRPC services the six services serve, as proto/ defines them. */
const SERVED_SERVICES: readonly DescService[] = [
  GRPCInferenceService,
  ApiKeyService,
  RouterService,
  BatcherService,
  WorkerService,
  CacheService,
  RegistryService,
  InstanceService,
  Health,
  ServerReflection,
  ServerReflectionV1Alpha,
];

/**
 * A matcher leaving out the served gRPC methods that stream (health and registry watches, mesh
 * announcements, artifact transfers, server reflection, the streams carrying calls): their durations
 * are stream lifetimes or transfers, so latency panels leave them out (the calls a stream carries are
 * recorded under their own method, as WorkerService/Infer).
 */
export const STREAMING_METHODS = `method!~".+/(${oneOf([
  ...new Set(SERVED_SERVICES.flatMap((s) => s.methods.filter((m) => m.methodKind !== 'unary').map((m) => m.name))),
])})"`;

/** gRPC status codes (the `code` label of grpc_server_handling_seconds) that are the server's fault. */
export const GRPC_SERVER_ERROR_CODES = [
  'UNKNOWN',
  'DEADLINE_EXCEEDED',
  'INTERNAL',
  'UNAVAILABLE',
  'DATA_LOSS',
  'UNIMPLEMENTED',
];
