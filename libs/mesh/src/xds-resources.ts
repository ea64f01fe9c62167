import {
  clusterName,
  edgeApiListener,
  edgeClusters,
  edgeListener,
  inboundApiListener,
  sidecarEdges,
  subsetOf,
} from './envoy-bootstrap';
import type { MeshPolicy, MeshService } from './mesh-policy';

/** The four resource types the control plane serves over ADS, by type URL. */
export const XDS_TYPES = {
  listener: 'type.googleapis.com/envoy.config.listener.v3.Listener',
  route: 'type.googleapis.com/envoy.config.route.v3.RouteConfiguration',
  cluster: 'type.googleapis.com/envoy.config.cluster.v3.Cluster',
  endpoint: 'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment',
} as const;
export type XdsTypeUrl = (typeof XDS_TYPES)[keyof typeof XDS_TYPES];

/** Each type's message in Envoy's API. */
export const XDS_TYPE_NAMES: Readonly<Record<XdsTypeUrl, string>> = {
  [XDS_TYPES.listener]: 'envoy.config.listener.v3.Listener',
  [XDS_TYPES.route]: 'envoy.config.route.v3.RouteConfiguration',
  [XDS_TYPES.cluster]: 'envoy.config.cluster.v3.Cluster',
  [XDS_TYPES.endpoint]: 'envoy.config.endpoint.v3.ClusterLoadAssignment',
};

/** Who asks: an Envoy sidecar (socket listeners, endpoints are the peers' sidecars) or a proxyless gRPC client (API listeners, endpoints are the processes). */
export type XdsClientKind = 'envoy' | 'grpc';

/** One running instance of a service, as it registered with the control plane. */
export interface MeshInstance {
  service: MeshService;
  /** Unique among the instances: `router-0`, a pod name. */
  id: string;
  address: string;
  /** The port the process serves gRPC on. */
  port: number;
  /** Labels that place it in subsets (`track: next`). */
  labels: Readonly<Record<string, string>>;
  /** Reported SERVING by its last heartbeat. */
  healthy: boolean;
}

/** Resources by type URL, then by name, in their JSON form. */
export type XdsResources = Record<XdsTypeUrl, Map<string, unknown>>;

/** The instances of a cluster: the service's, or those of one subset (every label of the subset matches). */
function members(
  policy: MeshPolicy,
  service: MeshService,
  subset: string | undefined,
  instances: readonly MeshInstance[],
): MeshInstance[] {
  const selector = subset === undefined ? {} : (policy.services[service].subsets[subset] ?? {});
  return instances.filter(
    (i) => i.service === service && Object.entries(selector).every(([k, v]) => i.labels[k] === v),
  );
}

/**
 * Everything a caller's clients are served, compiled from the policy and the running instances by
 * one pure function: the same inputs give the same resources, so versions can be content hashes.
 */
export function xdsResources(
  policy: MeshPolicy,
  caller: MeshService,
  kind: XdsClientKind,
  instances: readonly MeshInstance[],
  self?: MeshInstance,
): XdsResources {
  const resources: XdsResources = {
    [XDS_TYPES.listener]: new Map(),
    [XDS_TYPES.route]: new Map(),
    [XDS_TYPES.cluster]: new Map(),
    [XDS_TYPES.endpoint]: new Map(),
  };
  // A proxyless service reads its own inbound filters (the faults injected into its calls) from a
  // server listener; a sidecar has its inbound listener in its bootstrap.
  if (kind === 'grpc' && self !== undefined) {
    resources[XDS_TYPES.listener].set(
      'inbound',
      inboundApiListener(policy, caller, subsetOf(policy, caller, self.labels), self.address, self.port),
    );
  }
  // The batcher picks workers itself, so its sidecar does not proxy that edge; proxyless, it still
  // takes the edge's endpoints, ejection and retry settings from these resources.
  const edges = kind === 'envoy' ? sidecarEdges(policy, caller) : policy.edges.filter((edge) => edge.from === caller);
  for (const edge of edges) {
    resources[XDS_TYPES.listener].set(
      kind === 'envoy' ? `outbound_${edge.to}` : edge.to,
      kind === 'envoy' ? edgeListener(policy, edge) : edgeApiListener(edge),
    );
    // A sidecar's clusters speak mutual TLS (SDS from files); a proxyless client's carry no TLS settings.
    for (const cluster of edgeClusters(policy, edge, 'ads', kind === 'grpc')) {
      const name = String((cluster as { name: string }).name);
      resources[XDS_TYPES.cluster].set(name, cluster);
      const subset = name === clusterName(edge.to) ? undefined : name.slice(edge.to.length + 1);
      const endpoints = members(policy, edge.to, subset, instances);
      resources[XDS_TYPES.endpoint].set(name, {
        cluster_name: name,
        endpoints:
          endpoints.length === 0
            ? []
            : [
                {
                  locality: { zone: 'local' },
                  load_balancing_weight: 1,
                  lb_endpoints: endpoints.map((i) => ({
                    endpoint: {
                      address: {
                        socket_address: {
                          address: i.address,
                          port_value: kind === 'envoy' ? policy.sidecar.inboundPort : i.port,
                        },
                      },
                    },
                    health_status: i.healthy ? 'HEALTHY' : 'UNHEALTHY',
                    metadata: { filter_metadata: { infermesh: { instance: i.id } } },
                  })),
                },
              ],
      });
    }
  }
  return resources;
}
