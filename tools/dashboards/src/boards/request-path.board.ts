import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, labelVariable, timeSeries, type Query } from '../panels';
import {
  GRPC_SERVER_ERROR_CODES,
  INSTANCE,
  metric,
  oneOf,
  quantile,
  ratio,
  sel,
  SERVICES,
  STREAMING_METHODS,
  sumRate,
  type Service,
} from '../promql';
import { INFER_ENDPOINTS } from './slo.board';

const GATEWAY_DURATION = 'infermesh_gateway_request_duration_seconds';
const grpc = (service: Service) => metric(service, 'grpc_server_handling_seconds');

/** One query per service, its legend led by the service's name. */
function perService(expr: (service: Service) => string, legend: string): Query[] {
  return SERVICES.map((service) => ({ expr: expr(service), legend: `${service}${legend}` }));
}

export function requestPathBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-request-path',
    title: 'infermesh / Request path',
    description:
      'Rate, errors and duration at the edge (the gateway), per service and per hop. A hop is a gRPC method a service serves: GRPCInferenceService/ModelInfer on the gateway, RouterService/Infer on the router, BatcherService/Infer on the batcher, WorkerService/Infer on a worker, CacheService/Lookup and Store on the cache, RegistryService/* on the registry.',
    tags: ['red'],
    variables: [
      labelVariable(
        'instance',
        'Instance',
        'Replicas of any infermesh service (the instance label Prometheus gives each scrape target).',
        'label_values(up{job=~"infermesh-.+"}, instance)',
      ),
    ],
    rows: [
      {
        title: 'Edge (gateway)',
        panels: [
          timeSeries({
            title: 'Gateway requests by endpoint',
            description:
              'Requests per second on the public API by protocol and endpoint (REST route template or gRPC method), any status.',
            unit: 'reqps',
            span: 8,
            queries: [
              {
                expr: sumRate(`${GATEWAY_DURATION}_count`, sel(INSTANCE), ['protocol', 'endpoint']),
                legend: '{{protocol}} {{endpoint}}',
              },
            ],
          }),
          timeSeries({
            title: 'Gateway server errors by endpoint',
            description: `Requests per second answered with a server error: HTTP 5xx, or gRPC ${GRPC_SERVER_ERROR_CODES.join(', ')}.`,
            unit: 'reqps',
            span: 8,
            queries: [
              {
                expr: sumRate(
                  `${GATEWAY_DURATION}_count`,
                  sel(INSTANCE, `code=~"5..|${oneOf(GRPC_SERVER_ERROR_CODES)}"`),
                  ['endpoint', 'code'],
                ),
                legend: '{{endpoint}} {{code}}',
              },
            ],
          }),
          timeSeries({
            title: 'Gateway latency by endpoint',
            description: 'p50 and p99 of the public API requests by endpoint, any status.',
            unit: 's',
            span: 8,
            queries: [
              { expr: quantile(0.5, GATEWAY_DURATION, sel(INSTANCE), ['endpoint']), legend: '{{endpoint}} p50' },
              { expr: quantile(0.99, GATEWAY_DURATION, sel(INSTANCE), ['endpoint']), legend: '{{endpoint}} p99' },
            ],
          }),
          timeSeries({
            title: 'Refused at the edge',
            description:
              'Requests per second the gateway refused before the router: by a rate limit (per key or per model), because their body did not fit GATEWAY_MAX_BODY_BYTES_IN_FLIGHT, or at its concurrency limit (outcome overloaded, GATEWAY_CONCURRENCY_LIMIT); the rate-limit decisions taken by the GATEWAY_RATE_LIMIT_REDIS_DOWN policy while Redis was unreachable; the answers it dropped because their client had not read them in time: gRPC within GATEWAY_GRPC_SEND_TIMEOUT_MS, REST within GATEWAY_HTTP_SEND_TIMEOUT_MS; and the gRPC calls whose message had not come, given up to stay within GATEWAY_GRPC_MAX_CALLS_AWAITING_REQUEST.',
            unit: 'reqps',
            queries: [
              {
                expr: sumRate('infermesh_gateway_rate_limited_total', sel(INSTANCE), ['bucket']),
                legend: 'rate limit ({{bucket}})',
              },
              {
                expr: sumRate('infermesh_gateway_request_body_budget_refusals_total', sel(INSTANCE)),
                legend: 'body budget',
              },
              {
                expr: sumRate('infermesh_gateway_inference_requests_total', sel(INSTANCE, 'outcome="overloaded"')),
                legend: 'in-flight limit',
              },
              {
                expr: sumRate('infermesh_gateway_rate_limit_fallbacks_total', sel(INSTANCE), ['policy']),
                legend: 'Redis down: {{policy}}',
              },
              {
                expr: sumRate('infermesh_gateway_grpc_server_undelivered_answers_total', sel(INSTANCE)),
                legend: 'gRPC answers never read (dropped)',
              },
              {
                expr: sumRate('infermesh_gateway_http_undelivered_responses_total', sel(INSTANCE)),
                legend: 'REST responses never read (dropped)',
              },
              {
                expr: sumRate('infermesh_gateway_grpc_server_requests_evicted_total', sel(INSTANCE)),
                legend: 'gRPC calls never sent (evicted)',
              },
            ],
          }),
          timeSeries({
            title: 'Request body bytes in flight',
            description:
              'Bytes of request bodies each gateway replica holds at once (the budget is GATEWAY_MAX_BODY_BYTES_IN_FLIGHT).',
            unit: 'bytes',
            queries: [
              {
                expr: 'sum by (instance) (infermesh_gateway_request_body_bytes_in_flight{instance=~"$instance"})',
                legend: '{{instance}}',
              },
            ],
          }),
        ],
      },
      {
        title: 'Per service (gRPC server side)',
        panels: [
          timeSeries({
            title: 'gRPC calls per service',
            description:
              'Calls per second each service handled (grpc_server_handling_seconds), all methods and statuses.',
            unit: 'reqps',
            span: 8,
            queries: perService((s) => sumRate(`${grpc(s)}_count`, sel(INSTANCE)), ''),
          }),
          timeSeries({
            title: 'gRPC error ratio per service',
            description:
              'The share of the calls each service handled that ended with a status other than OK (client errors such as NOT_FOUND included).',
            unit: 'percentunit',
            span: 8,
            queries: perService(
              (s) =>
                ratio(
                  sumRate(`${grpc(s)}_count`, sel(INSTANCE, 'code!="OK"')),
                  sumRate(`${grpc(s)}_count`, sel(INSTANCE)),
                ),
              '',
            ),
          }),
          timeSeries({
            title: 'gRPC latency p99 per service',
            description:
              'p99 of the calls each service handled, long-lived streams (health and registry watches, mesh announcements) left out.',
            unit: 's',
            span: 8,
            queries: perService((s) => quantile(0.99, grpc(s), sel(INSTANCE, STREAMING_METHODS)), ' p99'),
          }),
        ],
      },
      {
        title: 'Per hop (gRPC method)',
        panels: [
          timeSeries({
            title: 'Calls per hop',
            description: 'Calls per second by the gRPC method that served them: each method is a hop into its service.',
            unit: 'reqps',
            legendTable: true,
            queries: perService((s) => sumRate(`${grpc(s)}_count`, sel(INSTANCE), ['method']), ' {{method}}'),
          }),
          timeSeries({
            title: 'Errors per hop',
            description: 'Calls per second that ended with a status other than OK, by method and status code.',
            unit: 'reqps',
            legendTable: true,
            queries: perService(
              (s) => sumRate(`${grpc(s)}_count`, sel(INSTANCE, 'code!="OK"'), ['method', 'code']),
              ' {{method}} {{code}}',
            ),
          }),
          timeSeries({
            title: 'Latency p99 per hop',
            description: 'p99 of the calls by method, long-lived streams left out.',
            unit: 's',
            legendTable: true,
            queries: perService(
              (s) => quantile(0.99, grpc(s), sel(INSTANCE, STREAMING_METHODS), ['method']),
              ' {{method}} p99',
            ),
          }),
          timeSeries({
            title: 'Latency p50 per hop',
            description: 'p50 of the calls by method, long-lived streams left out.',
            unit: 's',
            legendTable: true,
            queries: perService(
              (s) => quantile(0.5, grpc(s), sel(INSTANCE, STREAMING_METHODS), ['method']),
              ' {{method}} p50',
            ),
          }),
        ],
      },
      {
        title: 'Inference stages',
        panels: [
          timeSeries({
            title: 'Where an inference spends its time (p99)',
            description:
              "p99 of each stage an inference goes through, outermost first: the gateway's inference endpoints; the router (served requests, from the cache or not); the batcher from arrival to the worker's answer, and of that the wait in its queue; the worker's compute.",
            unit: 's',
            span: 24,
            height: 9,
            queries: [
              {
                expr: quantile(0.99, GATEWAY_DURATION, sel(INSTANCE, INFER_ENDPOINTS)),
                legend: 'gateway (inference endpoints)',
              },
              {
                expr: quantile(0.99, 'infermesh_router_request_duration_seconds', sel(INSTANCE), ['cached']),
                legend: 'router (cached={{cached}})',
              },
              {
                expr: quantile(0.99, 'infermesh_batcher_dispatch_duration_seconds', sel(INSTANCE)),
                legend: 'batcher: arrival to worker answer',
              },
              {
                expr: quantile(0.99, 'infermesh_batcher_queue_time_seconds', sel(INSTANCE)),
                legend: 'batcher: queue wait',
              },
              {
                expr: quantile(0.99, 'infermesh_worker_inference_compute_seconds', sel(INSTANCE)),
                legend: 'worker: compute',
              },
            ],
          }),
        ],
      },
    ],
  });
}
