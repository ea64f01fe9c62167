import { downstreamTransportSocket, rbacFilter, upstreamTransportSocket } from './envoy-security';
import {
  type FaultInjection,
  GRPC_STATUS_CODES,
  type MeshEdge,
  type MeshPolicy,
  type MeshService,
} from './mesh-policy';

/**
 * Envoy sidecar configurations, compiled from the mesh policy by pure functions: the same policy
 * always gives the same bootstrap, which tests diff against checked-in goldens and check against
 * Envoy's v3 API (envoy-api-check.ts). Field names are the protos' own (snake_case), as in Envoy's
 * YAML.
 *
 * - `ads`: the sidecar takes its listeners and clusters from the control plane (the registry) over
 *   ADS; its bootstrap holds only what it needs to reach it, its own service, and its admin/stats.
 * - `static`: everything compiled in, upstreams found by the Kubernetes Services' DNS names — the
 *   configuration to run without a control plane, and the reference the ADS resources follow.
 *
 * With `mtls` (envoy-security.ts), the inbound listener terminates mutual TLS and runs the RBAC
 * filter of the policy's `authorization`; every cluster to a service (and to the control plane)
 * presents the instance's certificate and checks the peer's SPIFFE ID.
 */
export type EnvoyMode = 'ads' | 'static';

type Json = Record<string, unknown>;

const any = (type: string, value: Json): Json => ({ '@type': `type.googleapis.com/${type}`, ...value });
const seconds = (ms: number): string => `${ms / 1000}s`;
const socketAddress = (address: string, port: number): Json => ({ socket_address: { address, port_value: port } });

/** Cluster names: the upstream service, or `<service>.<subset>` for one of its subsets. */
export function clusterName(service: MeshService, subset?: string): string {
  return subset === undefined ? service : `${service}.${subset}`;
}

/** The Kubernetes Service DNS name of a service (or of one of its subsets: `<service>-<subset>`). */
export function serviceHost(policy: MeshPolicy, service: MeshService, subset?: string): string {
  const { namespace, clusterDomain } = policy.kubernetes;
  return `${subset === undefined ? service : `${service}-${subset}`}.${namespace}.svc.${clusterDomain}`;
}

/** HTTP/2 to an upstream, as gRPC needs. */
const HTTP2_UPSTREAM: Json = {
  'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': any(
    'envoy.extensions.upstreams.http.v3.HttpProtocolOptions',
    {
      explicit_http_config: { http2_protocol_options: {} },
    },
  ),
};

/** One JSON line per request on stdout: who called what, how it ended, how long it took. */
const ACCESS_LOG: Json[] = [
  {
    name: 'envoy.access_loggers.stdout',
    typed_config: any('envoy.extensions.access_loggers.stream.v3.StdoutAccessLog', {
      log_format: {
        json_format: {
          time: '%START_TIME%',
          method: '%REQ(:METHOD)%',
          path: '%REQ(:PATH)%',
          status: '%RESPONSE_CODE%',
          grpc_status: '%GRPC_STATUS%',
          flags: '%RESPONSE_FLAGS%',
          duration_ms: '%DURATION%',
          bytes_received: '%BYTES_RECEIVED%',
          bytes_sent: '%BYTES_SENT%',
          upstream: '%UPSTREAM_HOST%',
          request_id: '%REQ(X-REQUEST-ID)%',
          traceparent: '%REQ(TRACEPARENT)%',
        },
      },
    }),
  },
];

const ROUTER_FILTER: Json = {
  name: 'envoy.filters.http.router',
  typed_config: any('envoy.extensions.filters.http.router.v3.Router', {}),
};

function httpConnectionManager(
  policy: MeshPolicy,
  service: MeshService,
  statPrefix: string,
  routeConfig: Json,
  filters: Json[],
  longLived = false,
): Json {
  return {
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: any('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
      stat_prefix: statPrefix,
      codec_type: 'AUTO',
      http2_protocol_options: {},
      // Streams on an edge without a time limit (to the registry: ADS, Announce, WatchModels) may
      // stay quiet for long: Envoy's default idle timeout (5 min) would reset them.
      ...(longLived && { stream_idle_timeout: '0s' }),
      route_config: routeConfig,
      http_filters: [...filters, ROUTER_FILTER],
      access_log: ACCESS_LOG,
      // W3C trace context goes through untouched; with a collector, Envoy adds its own spans.
      ...(policy.tracing !== undefined && {
        tracing: {
          provider: {
            name: 'envoy.tracers.opentelemetry',
            typed_config: any('envoy.config.trace.v3.OpenTelemetryConfig', {
              grpc_service: { envoy_grpc: { cluster_name: 'otel_collector' } },
              service_name: `${service}-sidecar`,
            }),
          },
        },
      }),
    }),
  };
}

function listener(name: string, address: string, port: number, hcm: Json, transportSocket?: Json): Json {
  return {
    name,
    address: socketAddress(address, port),
    filter_chains: [{ filters: [hcm], ...(transportSocket !== undefined && { transport_socket: transportSocket }) }],
  };
}

function retryPolicy(edge: MeshEdge): Json | undefined {
  const { retry } = edge;
  if (retry.attempts <= 1 || retry.on.length === 0) return undefined;
  return {
    retry_on: retry.on.join(','),
    num_retries: retry.attempts - 1,
    ...(retry.perTryTimeout !== undefined && { per_try_timeout: seconds(retry.perTryTimeout) }),
    retry_back_off: { base_interval: seconds(retry.backoff.base), max_interval: seconds(retry.backoff.max) },
    // A retry goes to another endpoint than the ones that already failed it, when there is one.
    retry_host_predicate: [
      {
        name: 'envoy.retry_host_predicates.previous_hosts',
        typed_config: any('envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate', {}),
      },
    ],
    host_selection_retry_max_attempts: 3,
  };
}

/** The route action that sends a request on an edge: to a subset, or split by weight, or to the whole service. */
function routeAction(edge: MeshEdge, subset?: string): Json {
  const split = edge.split.filter((part) => part.weight > 0);
  const target =
    subset !== undefined
      ? { cluster: clusterName(edge.to, subset) }
      : split.length === 0
        ? { cluster: clusterName(edge.to) }
        : split.length === 1
          ? { cluster: clusterName(edge.to, split[0]!.subset) }
          : {
              weighted_clusters: {
                clusters: split.map((part) => ({ name: clusterName(edge.to, part.subset), weight: part.weight })),
              },
            };
  const retry = retryPolicy(edge);
  return {
    ...target,
    timeout: seconds(edge.timeoutMs),
    // The caller's gRPC deadline (grpc-timeout) bounds the call when it is shorter than the edge's timeout.
    max_stream_duration: { grpc_timeout_header_max: seconds(edge.timeoutMs) },
    ...(retry !== undefined && { retry_policy: retry }),
    ...(edge.loadBalancing.policy === 'ring_hash' && {
      hash_policy: [{ header: { header_name: edge.loadBalancing.hashHeader } }],
    }),
    ...(edge.mirror !== undefined &&
      edge.mirror.percent > 0 && {
        request_mirror_policies: [
          {
            cluster: clusterName(edge.to, edge.mirror.subset),
            runtime_fraction: {
              default_value: { numerator: Math.round(edge.mirror.percent * 10_000), denominator: 'MILLION' },
            },
          },
        ],
      }),
  };
}

/** The routes of the edge from one caller to `edge.to`: header matches first, then everything else. */
export function edgeRouteConfiguration(edge: MeshEdge): Json {
  return {
    name: edge.to,
    virtual_hosts: [
      {
        name: edge.to,
        domains: ['*'],
        routes: [
          ...edge.routes.map((route) => ({
            match: { prefix: '/', headers: [{ name: route.header, string_match: { exact: route.exact } }] },
            route: routeAction(edge, route.subset),
          })),
          { match: { prefix: '/' }, route: routeAction(edge) },
        ],
      },
    ],
  };
}

/** Health checks are exempt from inbound faults: an instance that fails some calls on purpose still reports its health truly. */
export const FAULT_EXEMPT_PATH_PREFIX = '/grpc.health.v1.Health/';

/** The HTTP fault filter for injected aborts and delays; none without a fault. Inbound, health checks are exempt. */
function faultFilter(fault: FaultInjection | undefined, inbound = false): Json[] {
  if (fault === undefined || (fault.abort === undefined && fault.delay === undefined)) return [];
  const fraction = (percent: number) => ({ numerator: Math.round(percent * 10_000), denominator: 'MILLION' });
  return [
    {
      name: 'envoy.filters.http.fault',
      typed_config: any('envoy.extensions.filters.http.fault.v3.HTTPFault', {
        ...(fault.abort !== undefined && {
          abort: { grpc_status: GRPC_STATUS_CODES[fault.abort.grpcStatus], percentage: fraction(fault.abort.percent) },
        }),
        ...(fault.delay !== undefined && {
          delay: { fixed_delay: seconds(fault.delay.fixed), percentage: fraction(fault.delay.percent) },
        }),
        ...(inbound && {
          headers: [{ name: ':path', string_match: { prefix: FAULT_EXEMPT_PATH_PREFIX }, invert_match: true }],
        }),
      }),
    },
  ];
}

/** A gRPC health check of every endpoint (grpc.health.v1), so a NOT_SERVING instance takes no calls. */
const GRPC_HEALTH_CHECK: Json = {
  timeout: '1s',
  interval: '5s',
  unhealthy_threshold: 3,
  healthy_threshold: 1,
  grpc_health_check: {},
};

/**
 * The balancing policy as a list of candidates (gRFC A52): each client takes the first it supports.
 * Envoy does least request; grpc-js has no least request and falls back to round robin.
 */
function lbSettings(edge: MeshEdge): Json {
  const lb = edge.loadBalancing;
  const policy = (name: string, type: string, config: Json = {}) => ({
    typed_extension_config: { name, typed_config: any(type, config) },
  });
  const roundRobin = policy(
    'envoy.load_balancing_policies.round_robin',
    'envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin',
  );
  switch (lb.policy) {
    case 'least_request':
      return {
        load_balancing_policy: {
          policies: [
            policy(
              'envoy.load_balancing_policies.least_request',
              'envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest',
              {
                choice_count: lb.choiceCount,
              },
            ),
            roundRobin,
          ],
        },
      };
    case 'round_robin':
      return { load_balancing_policy: { policies: [roundRobin] } };
    case 'ring_hash':
      return {
        load_balancing_policy: {
          policies: [
            policy(
              'envoy.load_balancing_policies.ring_hash',
              'envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash',
              { hash_function: 'XX_HASH' },
            ),
          ],
        },
      };
  }
}

function outlierDetection(edge: MeshEdge): Json {
  const od = edge.outlierDetection;
  return {
    consecutive_5xx: od.consecutiveFailures,
    enforcing_consecutive_5xx: od.consecutiveFailures > 0 ? 100 : 0,
    consecutive_gateway_failure: od.consecutiveGatewayFailures,
    enforcing_consecutive_gateway_failure: od.consecutiveGatewayFailures > 0 ? 100 : 0,
    interval: seconds(od.interval),
    base_ejection_time: seconds(od.baseEjectionTime),
    max_ejection_percent: od.maxEjectionPercent,
    enforcing_success_rate: od.successRate === undefined ? 0 : 100,
    ...(od.successRate !== undefined && {
      success_rate_stdev_factor: od.successRate.stdevFactor,
      success_rate_minimum_hosts: od.successRate.minimumHosts,
      success_rate_request_volume: od.successRate.requestVolume,
    }),
    ...(od.failurePercentage !== undefined && {
      failure_percentage_threshold: od.failurePercentage.threshold,
      failure_percentage_minimum_hosts: od.failurePercentage.minimumHosts,
      failure_percentage_request_volume: od.failurePercentage.requestVolume,
      enforcing_failure_percentage: 100,
    }),
  };
}

/**
 * The cluster of an upstream service (or of one of its subsets), as seen from one caller's edge.
 * A sidecar's speaks mutual TLS to the upstream's sidecars (with `mtls`); a proxyless client's
 * (`proxyless`) has no transport socket: grpc-js-xds refuses SDS, and such a client brings its own
 * credentials.
 */
export function edgeCluster(
  policy: MeshPolicy,
  edge: MeshEdge,
  mode: EnvoyMode,
  subset?: string,
  proxyless = false,
): Json {
  const name = clusterName(edge.to, subset);
  const cb = edge.circuitBreakers;
  const discovery: Json =
    mode === 'ads'
      ? { type: 'EDS', eds_cluster_config: { eds_config: { ads: {}, resource_api_version: 'V3' }, service_name: name } }
      : {
          type: 'STRICT_DNS',
          load_assignment: {
            cluster_name: name,
            endpoints: [
              {
                lb_endpoints: [
                  {
                    endpoint: {
                      address: socketAddress(serviceHost(policy, edge.to, subset), policy.sidecar.inboundPort),
                    },
                  },
                ],
              },
            ],
          },
        };
  return {
    name,
    ...discovery,
    connect_timeout: seconds(edge.connectTimeoutMs),
    ...lbSettings(edge),
    ...transportSocketField(proxyless ? undefined : upstreamTransportSocket(policy, edge.to)),
    typed_extension_protocol_options: HTTP2_UPSTREAM,
    health_checks: [GRPC_HEALTH_CHECK],
    outlier_detection: outlierDetection(edge),
    circuit_breakers: {
      thresholds: [
        {
          priority: 'DEFAULT',
          max_connections: cb.maxConnections,
          max_pending_requests: cb.maxPendingRequests,
          max_requests: cb.maxRequests,
          max_retries: cb.maxRetries,
          retry_budget: {
            budget_percent: { value: edge.retry.budget.percent },
            min_retry_concurrency: edge.retry.budget.minConcurrency,
          },
        },
      ],
    },
  };
}

/** `transport_socket`, when there is one. */
function transportSocketField(socket: Json | undefined): Json {
  return socket === undefined ? {} : { transport_socket: socket };
}

/** The clusters one edge needs: the whole service, and each subset it routes, splits or mirrors to (for a proxyless client: without TLS). */
export function edgeClusters(policy: MeshPolicy, edge: MeshEdge, mode: EnvoyMode, proxyless = false): Json[] {
  const subsets = new Set<string>([...edge.routes.map((r) => r.subset), ...edge.split.map((s) => s.subset)]);
  if (edge.mirror !== undefined) subsets.add(edge.mirror.subset);
  return [
    edgeCluster(policy, edge, mode, undefined, proxyless),
    ...[...subsets].sort().map((subset) => edgeCluster(policy, edge, mode, subset, proxyless)),
  ];
}

/** Edges a sidecar proxies: the service's upstreams, except those the service chooses endpoints of itself (batcher → worker). */
export function sidecarEdges(policy: MeshPolicy, service: MeshService): MeshEdge[] {
  return policy.edges.filter((edge) => edge.from === service && !(edge.from === 'batcher' && edge.to === 'worker'));
}

/** The outbound listener for an edge: 127.0.0.1:<upstream's port>, so the service dials its upstream as without a mesh. */
export function edgeListener(policy: MeshPolicy, edge: MeshEdge): Json {
  return listener(
    `outbound_${edge.to}`,
    '127.0.0.1',
    policy.services[edge.to].port,
    httpConnectionManager(
      policy,
      edge.from,
      `outbound_${edge.to}`,
      edgeRouteConfiguration(edge),
      faultFilter(edge.fault),
      edge.timeoutMs === 0,
    ),
  );
}

/**
 * The listener a proxyless gRPC client (grpc-js-xds) asks for when it dials `xds:///<upstream>`: no
 * socket, the same routes and filters as a sidecar's outbound listener.
 */
export function edgeApiListener(edge: MeshEdge): Json {
  return {
    name: edge.to,
    api_listener: {
      api_listener: any('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
        stat_prefix: `outbound_${edge.to}`,
        route_config: edgeRouteConfiguration(edge),
        http_filters: [...faultFilter(edge.fault), ROUTER_FILTER],
      }),
    },
  };
}

/** The fault injected into calls arriving at the service's instances of `subset` (any instance: undefined), if any. */
export function inboundFaultOf(
  policy: MeshPolicy,
  service: MeshService,
  subset: string | undefined,
): FaultInjection | undefined {
  const fault = policy.services[service].inboundFault;
  return fault !== undefined && (fault.subset === undefined || fault.subset === subset) ? fault : undefined;
}

/** Which subset of the service an instance with these labels is in (the first whose labels all match). */
export function subsetOf(
  policy: MeshPolicy,
  service: MeshService,
  labels: Readonly<Record<string, string>>,
): string | undefined {
  return Object.entries(policy.services[service].subsets).find(([, selector]) =>
    Object.entries(selector).every(([k, v]) => labels[k] === v),
  )?.[0];
}

/**
 * The HTTP filters of a service's inbound listener, sidecar or proxyless: the RBAC filter of its
 * authorization (with mTLS), then its inbound fault (health checks exempt from both), then the router.
 */
function inboundFilters(policy: MeshPolicy, service: MeshService, subset: string | undefined): Json[] {
  return [...rbacFilter(policy, service), ...faultFilter(inboundFaultOf(policy, service, subset), true)];
}

/**
 * The listener a proxyless service reads its inbound filters from (gRFC A36's server listener): its
 * own address, the same HTTP filters as its sidecar's inbound listener (the RBAC filter its server
 * enforces, read by inboundAuthorizationOf; the fault filter, by inboundFaultsOf), and no forwarding.
 * No transport socket: the server's TLS is its own (the same identity files).
 */
export function inboundApiListener(
  policy: MeshPolicy,
  service: MeshService,
  subset: string | undefined,
  address: string,
  port: number,
): Json {
  return {
    name: 'inbound',
    address: socketAddress(address, port),
    filter_chains: [
      {
        filters: [
          {
            name: 'envoy.filters.network.http_connection_manager',
            typed_config: any('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
              stat_prefix: 'inbound',
              route_config: {
                name: 'inbound',
                virtual_hosts: [
                  { name: service, domains: ['*'], routes: [{ match: { prefix: '/' }, non_forwarding_action: {} }] },
                ],
              },
              http_filters: [...inboundFilters(policy, service, subset), ROUTER_FILTER],
            }),
          },
        ],
      },
    ],
  };
}

/**
 * The bootstrap of the Envoy sidecar next to `service` (in the pods of `subset`, when the policy
 * injects faults into that subset's inbound calls only).
 */
export function envoyBootstrap(policy: MeshPolicy, service: MeshService, mode: EnvoyMode, subset?: string): Json {
  const { sidecar } = policy;
  const edges = sidecarEdges(policy, service);
  // Callers hold streams open to this service as long as they run: to the control plane (every
  // sidecar's ADS), and on any edge to it with no time limit.
  const longLived = service === 'registry' || policy.edges.some((edge) => edge.to === service && edge.timeoutMs === 0);
  const http1Local = (name: string, port: number, http2: boolean): Json => ({
    name,
    type: 'STATIC',
    connect_timeout: '1s',
    load_assignment: {
      cluster_name: name,
      endpoints: [{ lb_endpoints: [{ endpoint: { address: socketAddress('127.0.0.1', port) } }] }],
    },
    ...(http2 && { typed_extension_protocol_options: HTTP2_UPSTREAM }),
  });
  const inbound = listener(
    'inbound',
    '0.0.0.0',
    sidecar.inboundPort,
    httpConnectionManager(
      policy,
      service,
      'inbound',
      {
        name: 'inbound',
        virtual_hosts: [
          {
            name: service,
            domains: ['*'],
            // The service enforces each call's deadline itself; streams (watches, uploads) may be long.
            routes: [{ match: { prefix: '/' }, route: { cluster: 'local_app', timeout: '0s' } }],
          },
        ],
      },
      inboundFilters(policy, service, subset),
      longLived,
    ),
    downstreamTransportSocket(policy, service),
  );
  const stats = listener('stats', '0.0.0.0', sidecar.statsPort, {
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: any('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
      stat_prefix: 'stats',
      codec_type: 'AUTO',
      route_config: {
        name: 'stats',
        virtual_hosts: [
          {
            name: 'stats',
            domains: ['*'],
            routes: [
              { match: { path: '/stats/prometheus' }, route: { cluster: 'envoy_admin' } },
              { match: { path: '/ready' }, route: { cluster: 'envoy_admin' } },
            ],
          },
        ],
      },
      http_filters: [ROUTER_FILTER],
    }),
  });
  const controlPlane: Json = {
    name: 'xds_control_plane',
    type: 'STRICT_DNS',
    connect_timeout: '1s',
    load_assignment: {
      cluster_name: 'xds_control_plane',
      endpoints: [
        {
          lb_endpoints: [
            { endpoint: { address: socketAddress(serviceHost(policy, 'registry'), sidecar.inboundPort) } },
          ],
        },
      ],
    },
    // Mutual TLS to the registry's sidecar, certificates from files (SDS from the control plane could not bootstrap itself).
    ...transportSocketField(upstreamTransportSocket(policy, 'registry')),
    typed_extension_protocol_options: HTTP2_UPSTREAM,
  };
  const collector: Json[] =
    policy.tracing === undefined
      ? []
      : [
          {
            name: 'otel_collector',
            type: 'STRICT_DNS',
            connect_timeout: '1s',
            load_assignment: {
              cluster_name: 'otel_collector',
              endpoints: [
                {
                  lb_endpoints: [
                    {
                      endpoint: {
                        address: socketAddress(
                          policy.tracing.collector.split(':')[0]!,
                          Number(policy.tracing.collector.split(':')[1]),
                        ),
                      },
                    },
                  ],
                },
              ],
            },
            typed_extension_protocol_options: HTTP2_UPSTREAM,
          },
        ];
  const upstreams = mode === 'static' ? edges : [];
  return {
    node: { id: service, cluster: service, metadata: { service, mesh: 'infermesh' } },
    admin: { address: socketAddress('127.0.0.1', sidecar.adminPort) },
    static_resources: {
      listeners: [inbound, stats, ...upstreams.map((edge) => edgeListener(policy, edge))],
      clusters: [
        {
          ...http1Local('local_app', policy.services[service].port, true),
          // A service whose callers hold streams open without a time limit (the registry: every
          // sidecar's ADS, every announcement, the watches) takes more than Envoy's default 1,024.
          ...(longLived && {
            circuit_breakers: {
              thresholds: [{ max_connections: 65_536, max_pending_requests: 65_536, max_requests: 65_536 }],
            },
          }),
        },
        http1Local('envoy_admin', sidecar.adminPort, false),
        ...(mode === 'ads' ? [controlPlane] : []),
        ...collector,
        ...upstreams.flatMap((edge) => edgeClusters(policy, edge, mode)),
      ],
    },
    ...(mode === 'ads' && {
      dynamic_resources: {
        ads_config: {
          api_type: 'GRPC',
          transport_api_version: 'V3',
          grpc_services: [{ envoy_grpc: { cluster_name: 'xds_control_plane' } }],
          set_node_on_first_message_only: true,
        },
        lds_config: { ads: {}, resource_api_version: 'V3' },
        cds_config: { ads: {}, resource_api_version: 'V3' },
      },
    }),
  };
}
