import * as grpc from '@grpc/grpc-js';
import { createHash } from 'node:crypto';
import type { EnvoyApi } from './envoy-api-check';
import { XDS_TYPE_NAMES, XDS_TYPES, type XdsResources, type XdsTypeUrl } from './xds-resources';

/** Who is asking, from the first request of a stream. */
export interface XdsNode {
  id: string;
  /** The calling service (Envoy's --service-cluster, the `cluster` of a gRPC client's bootstrap). */
  cluster: string;
  /** "envoy" for Envoy; grpc-js-xds names itself otherwise. */
  userAgentName: string;
}

/** What the control plane serves a node; undefined: nothing (an unknown caller). */
export type XdsSnapshotSource = (node: XdsNode) => XdsResources | undefined;

/** Something a stream did, for the control plane's log and metrics. */
export type AdsEvent =
  | { kind: 'connected' | 'disconnected'; node: XdsNode | undefined }
  | { kind: 'sent'; node: XdsNode; typeUrl: string; version: string; resources: number }
  | { kind: 'ack'; node: XdsNode; typeUrl: string; version: string }
  | { kind: 'nack'; node: XdsNode; typeUrl: string; version: string; error: string }
  | { kind: 'refused'; typeUrl: string; name: string; problems: string[] };

interface DiscoveryRequest {
  version_info?: string;
  node?: { id?: string; cluster?: string; user_agent_name?: string };
  resource_names?: string[];
  type_url?: string;
  response_nonce?: string;
  error_detail?: { code?: number; message?: string };
}

/** One type's resources, encoded, with a version that is a hash of their content. */
interface EncodedType {
  version: string;
  resources: Map<string, Uint8Array>;
}

/** A stream's subscription to one type. */
interface Subscription {
  /** The names asked for; undefined: every resource (a wildcard LDS/CDS request). */
  names: Set<string> | undefined;
  sentVersion: string | undefined;
  nonce: string | undefined;
  nackedVersion: string | undefined;
}

/**
 * The xDS v3 Aggregated Discovery Service, state of the world: each stream is answered from its
 * node's snapshot, each type versioned by a hash of its resources, so only what changed is sent
 * again. An ACK records the version the node runs; a NACK is reported and the node keeps its last
 * good version (the same version is not sent again; the next change is). Every resource is checked
 * against Envoy's API before it is served: one that fails is refused, and the last good snapshot of
 * that node stays.
 */
export class AdsServer {
  readonly counters = { streams: 0, responses: 0, acks: 0, nacks: 0, refused: 0 };
  private readonly streams = new Set<AdsStream>();
  private readonly encodedCache = new Map<string, Uint8Array>();

  constructor(
    readonly api: EnvoyApi,
    private readonly source: XdsSnapshotSource,
    private readonly onEvent: (event: AdsEvent) => void = () => undefined,
  ) {}

  /** Adds envoy.service.discovery.v3.AggregatedDiscoveryService to a grpc-js server. */
  addTo(server: grpc.Server): void {
    const { definition, implementation } = this.service();
    server.addService(definition, implementation);
  }

  /** envoy.service.discovery.v3.AggregatedDiscoveryService: its definition (Envoy's messages) and handler. */
  service(): { definition: grpc.ServiceDefinition; implementation: grpc.UntypedServiceImplementation } {
    const request = this.api.lookupType('envoy.service.discovery.v3.DiscoveryRequest')!;
    const response = this.api.lookupType('envoy.service.discovery.v3.DiscoveryResponse')!;
    const definition: grpc.ServiceDefinition = {
      StreamAggregatedResources: {
        path: '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources',
        requestStream: true,
        responseStream: true,
        requestSerialize: (value: object) => Buffer.from(request.encode(request.fromObject(value)).finish()),
        requestDeserialize: (bytes: Buffer) =>
          request.toObject(request.decode(bytes), { longs: String, enums: String }),
        responseSerialize: (value: object) => Buffer.from(response.encode(response.fromObject(value)).finish()),
        responseDeserialize: (bytes: Buffer) =>
          response.toObject(response.decode(bytes), { longs: String, enums: String }),
      },
    };
    const implementation: grpc.UntypedServiceImplementation = {
      StreamAggregatedResources: (call: grpc.ServerDuplexStream<DiscoveryRequest, object>) => {
        const stream = new AdsStream(this, call);
        this.streams.add(stream);
        this.counters.streams += 1;
        this.onEvent({ kind: 'connected', node: undefined });
        call.on('data', (message: DiscoveryRequest) => {
          try {
            stream.onRequest(message);
          } catch (error) {
            // A request this server cannot answer ends its stream (the client reconnects), never the process.
            call.emit('error', {
              code: grpc.status.INTERNAL,
              details: `xDS: ${error instanceof Error ? error.message : String(error)}`,
            });
          }
        });
        const end = () => {
          if (!this.streams.delete(stream)) return;
          this.onEvent({ kind: 'disconnected', node: stream.node });
          call.end();
        };
        call.on('end', end);
        call.on('error', end);
        call.on('cancelled', end);
      },
    };
    return { definition, implementation };
  }

  /** Recomputes every connected node's snapshot and sends each type whose content changed. */
  refresh(): void {
    for (const stream of this.streams) stream.refresh();
  }

  /** Nodes connected now, with the version of each type they acknowledged. */
  connectedNodes(): { node: XdsNode; acked: Record<string, string | undefined> }[] {
    return [...this.streams]
      .filter((s) => s.node !== undefined)
      .map((s) => ({ node: s.node!, acked: s.ackedVersions() }));
  }

  /** Ends every stream (on shutdown). */
  close(): void {
    for (const stream of this.streams) stream.end();
    this.streams.clear();
  }

  /** @internal */
  report(event: AdsEvent): void {
    if (event.kind === 'ack') this.counters.acks += 1;
    if (event.kind === 'nack') this.counters.nacks += 1;
    if (event.kind === 'sent') this.counters.responses += 1;
    if (event.kind === 'refused') this.counters.refused += 1;
    this.onEvent(event);
  }

  /** @internal The node's resources, encoded and versioned per type; undefined when the source has none. */
  snapshotFor(node: XdsNode): Map<XdsTypeUrl, EncodedType> | undefined {
    const resources = this.source(node);
    if (resources === undefined) return undefined;
    const snapshot = new Map<XdsTypeUrl, EncodedType>();
    for (const typeUrl of Object.values(XDS_TYPES)) {
      const encoded = new Map<string, Uint8Array>();
      const hash = createHash('sha256');
      for (const [name, json] of [...resources[typeUrl]].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
        const bytes = this.encodeChecked(typeUrl, name, json);
        if (bytes === undefined) return undefined;
        encoded.set(name, bytes);
        hash.update(name).update('\0').update(bytes);
      }
      snapshot.set(typeUrl, { version: hash.digest('hex').slice(0, 16), resources: encoded });
    }
    return snapshot;
  }

  private encodeChecked(typeUrl: XdsTypeUrl, name: string, json: unknown): Uint8Array | undefined {
    const key = `${typeUrl}\0${JSON.stringify(json)}`;
    const cached = this.encodedCache.get(key);
    if (cached !== undefined) return cached;
    const problems = this.api.check(XDS_TYPE_NAMES[typeUrl], json);
    if (problems.length > 0) {
      this.report({ kind: 'refused', typeUrl, name, problems });
      return undefined;
    }
    const bytes = this.api.encode(XDS_TYPE_NAMES[typeUrl], json);
    if (this.encodedCache.size > 10_000) this.encodedCache.clear();
    this.encodedCache.set(key, bytes);
    return bytes;
  }
}

class AdsStream {
  node: XdsNode | undefined;
  private snapshot: Map<XdsTypeUrl, EncodedType> | undefined;
  private readonly subscriptions = new Map<string, Subscription>();
  private readonly acked = new Map<string, string>();
  private nonce = 0;

  constructor(
    private readonly server: AdsServer,
    private readonly call: grpc.ServerDuplexStream<DiscoveryRequest, object>,
  ) {}

  ackedVersions(): Record<string, string | undefined> {
    return Object.fromEntries(this.acked);
  }

  onRequest(request: DiscoveryRequest): void {
    if (this.node === undefined) {
      this.node = {
        id: request.node?.id ?? '',
        cluster: request.node?.cluster ?? '',
        userAgentName: request.node?.user_agent_name ?? '',
      };
      this.snapshot = this.server.snapshotFor(this.node);
    }
    const typeUrl = request.type_url ?? '';
    if (!Object.values<string>(XDS_TYPES).includes(typeUrl)) return;
    let subscription = this.subscriptions.get(typeUrl);
    const nonce = request.response_nonce ?? '';
    if (subscription !== undefined && nonce !== '' && nonce !== subscription.nonce) return; // stale: answers an older response
    if (subscription === undefined) {
      subscription = { names: undefined, sentVersion: undefined, nonce: undefined, nackedVersion: undefined };
      this.subscriptions.set(typeUrl, subscription);
    }
    if (nonce !== '' && subscription.sentVersion !== undefined) {
      if (
        request.error_detail !== undefined &&
        request.error_detail !== null &&
        (request.error_detail.message ?? '') !== ''
      ) {
        subscription.nackedVersion = subscription.sentVersion;
        this.server.report({
          kind: 'nack',
          node: this.node,
          typeUrl,
          version: subscription.sentVersion,
          error: request.error_detail.message ?? '',
        });
      } else {
        this.acked.set(typeUrl, subscription.sentVersion);
        this.server.report({ kind: 'ack', node: this.node, typeUrl, version: subscription.sentVersion });
      }
    }
    const names = request.resource_names ?? [];
    const wanted = names.length === 0 || names.includes('*') ? undefined : new Set(names);
    const changed = !sameNames(subscription.names, wanted);
    subscription.names = wanted;
    const current = this.snapshot?.get(typeUrl as XdsTypeUrl);
    if (current === undefined) return;
    if (changed || (current.version !== subscription.sentVersion && current.version !== subscription.nackedVersion)) {
      this.send(typeUrl as XdsTypeUrl, subscription, current);
    }
  }

  refresh(): void {
    if (this.node === undefined) return;
    const next = this.server.snapshotFor(this.node);
    if (next === undefined) return; // the last good snapshot stays
    this.snapshot = next;
    for (const [typeUrl, subscription] of this.subscriptions) {
      const current = next.get(typeUrl as XdsTypeUrl);
      if (current !== undefined && current.version !== subscription.sentVersion)
        this.send(typeUrl as XdsTypeUrl, subscription, current);
    }
  }

  end(): void {
    this.call.end();
  }

  private send(typeUrl: XdsTypeUrl, subscription: Subscription, current: EncodedType): void {
    this.nonce += 1;
    const nonce = String(this.nonce);
    const resources = [...current.resources]
      .filter(([name]) => subscription.names === undefined || subscription.names.has(name))
      .map(([, value]) => ({ type_url: typeUrl, value }));
    subscription.sentVersion = current.version;
    subscription.nonce = nonce;
    this.call.write({ version_info: current.version, resources, type_url: typeUrl, nonce });
    this.server.report({
      kind: 'sent',
      node: this.node!,
      typeUrl,
      version: current.version,
      resources: resources.length,
    });
  }
}

function sameNames(a: Set<string> | undefined, b: Set<string> | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return a.size === b.size && [...a].every((n) => b.has(n));
}
