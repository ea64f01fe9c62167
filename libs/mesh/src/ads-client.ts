import * as grpc from '@grpc/grpc-js';
import { type Clock, systemClock } from '@infermesh/clock';
import type { EnvoyApi } from './envoy-api-check';
import { XDS_TYPE_NAMES, type XdsTypeUrl } from './xds-resources';

/** What a watch is given: the resources of its type that it asked for and the control plane has, by name, in their JSON form. */
export type XdsUpdate = ReadonlyMap<string, unknown>;

/**
 * What a component does with its resources: `parse` turns them into what it uses, and throws with
 * the reason when it cannot (the update is refused, NACKed, and the last one stays, as Envoy does);
 * `apply` takes the parsed value once every watcher of the response has parsed its part.
 */
export interface XdsWatcher<T> {
  parse(resources: XdsUpdate): T;
  apply(value: T): void;
}

interface Watcher {
  names: readonly string[];
  handler: XdsWatcher<unknown>;
}

/** One type's subscription: every watcher's names, and the version and nonce of the last response, to ACK or NACK with. */
interface Subscription {
  typeUrl: XdsTypeUrl;
  watchers: Watcher[];
  version: string;
  nonce: string;
}

/** Something the client did, for its service's log and metrics. */
export type AdsClientEvent =
  | { kind: 'connected' | 'disconnected'; error?: string }
  | { kind: 'ack'; typeUrl: string; version: string }
  | { kind: 'nack'; typeUrl: string; version: string; error: string };

interface DiscoveryResponse {
  version_info?: string;
  resources?: { type_url?: string; value?: Uint8Array }[];
  type_url?: string;
  nonce?: string;
}

/**
 * A small xDS v3 client over ADS (state of the world) for what grpc-js-xds does not take itself: a
 * service's own inbound listener (the faults the policy injects where calls arrive) and the batcher's
 * view of the workers (endpoints, outlier detection, retries). Each watch names its resources of one
 * type; each response is decoded, validated, handed over and ACKed, or NACKed with the reason. A
 * broken stream is opened again with backoff, and every watch asked for again.
 */
export class AdsClient {
  private readonly subscriptions = new Map<XdsTypeUrl, Subscription>();
  private readonly client: grpc.Client;
  private readonly method: grpc.MethodDefinition<object, DiscoveryResponse>;
  private call: grpc.ClientDuplexStream<object, DiscoveryResponse> | undefined;
  private stopped = false;
  private cancelRetry: (() => void) | undefined;
  private backoffMs = 100;

  constructor(
    private readonly api: EnvoyApi,
    target: string,
    private readonly node: { id: string; cluster: string },
    private readonly onEvent: (event: AdsClientEvent) => void = () => undefined,
    /** How to reach the control plane: plaintext unless given (mutual TLS, in the mesh). */
    security: { credentials: grpc.ChannelCredentials; options: grpc.ChannelOptions } = {
      credentials: grpc.credentials.createInsecure(),
      options: {},
    },
    /** Time: the backoff before a broken stream is opened again (systemClock unless given). */
    private readonly clock: Clock = systemClock,
  ) {
    const request = api.lookupType('envoy.service.discovery.v3.DiscoveryRequest')!;
    const response = api.lookupType('envoy.service.discovery.v3.DiscoveryResponse')!;
    this.method = {
      path: '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources',
      requestStream: true,
      responseStream: true,
      requestSerialize: (value: object) => Buffer.from(request.encode(request.fromObject(value)).finish()),
      requestDeserialize: (bytes: Buffer) => request.decode(bytes),
      responseSerialize: (value: object) => Buffer.from(response.encode(response.fromObject(value)).finish()),
      responseDeserialize: (bytes: Buffer) =>
        response.toObject(response.decode(bytes), { longs: String, enums: String }),
    };
    this.client = new grpc.Client(target, security.credentials, security.options);
  }

  /** Asks for resources of one type, by name (several watchers may share a type). */
  watch<T>(typeUrl: XdsTypeUrl, names: readonly string[], handler: XdsWatcher<T>): void {
    let subscription = this.subscriptions.get(typeUrl);
    if (subscription === undefined) {
      subscription = { typeUrl, watchers: [], version: '', nonce: '' };
      this.subscriptions.set(typeUrl, subscription);
    }
    subscription.watchers.push({ names, handler });
    if (this.call !== undefined) this.request(subscription);
  }

  start(): void {
    if (this.call !== undefined || this.stopped) return;
    const call = this.client.makeBidiStreamRequest(
      this.method.path,
      this.method.requestSerialize,
      this.method.responseDeserialize,
    );
    this.call = call;
    let connected = false;
    call.on('data', (response: DiscoveryResponse) => {
      if (!connected) {
        connected = true;
        this.backoffMs = 100;
        this.onEvent({ kind: 'connected' });
      }
      this.onResponse(response);
    });
    const broken = (error?: grpc.ServiceError) => {
      if (this.call !== call) return;
      this.call = undefined;
      if (this.stopped) return;
      this.onEvent({ kind: 'disconnected', ...(error !== undefined && { error: error.details || error.message }) });
      // A version from the broken stream is still what this client runs: ask with it, a new nonce will come.
      for (const subscription of this.subscriptions.values()) subscription.nonce = '';
      this.cancelRetry = this.clock.setTimer(() => this.start(), Math.random() * this.backoffMs);
      this.backoffMs = Math.min(5_000, this.backoffMs * 2);
    };
    call.on('error', broken);
    call.on('end', () => broken());
    for (const subscription of this.subscriptions.values()) this.request(subscription);
  }

  close(): void {
    this.stopped = true;
    this.cancelRetry?.();
    this.call?.cancel();
    this.call = undefined;
    this.client.close();
  }

  private request(subscription: Subscription, error?: string): void {
    this.call?.write({
      version_info: subscription.version,
      node: { id: this.node.id, cluster: this.node.cluster, user_agent_name: 'infermesh' },
      resource_names: [...new Set(subscription.watchers.flatMap((w) => w.names))].sort(),
      type_url: subscription.typeUrl,
      response_nonce: subscription.nonce,
      ...(error !== undefined && { error_detail: { code: grpc.status.INVALID_ARGUMENT, message: error } }),
    });
  }

  private onResponse(response: DiscoveryResponse): void {
    const subscription = this.subscriptions.get(response.type_url as XdsTypeUrl);
    if (subscription === undefined) return;
    subscription.nonce = response.nonce ?? '';
    const version = response.version_info ?? '';
    let parsed: { watcher: Watcher; value: unknown }[] = [];
    let problem: string | undefined;
    try {
      const all = this.decode(subscription.typeUrl, response);
      parsed = subscription.watchers.map((watcher) => ({
        watcher,
        value: watcher.handler.parse(new Map(watcher.names.filter((n) => all.has(n)).map((n) => [n, all.get(n)]))),
      }));
    } catch (error) {
      problem = error instanceof Error ? error.message : String(error);
    }
    if (problem !== undefined) {
      this.request(subscription, problem);
      this.onEvent({ kind: 'nack', typeUrl: subscription.typeUrl, version, error: problem });
      return;
    }
    subscription.version = version;
    this.request(subscription);
    this.onEvent({ kind: 'ack', typeUrl: subscription.typeUrl, version });
    for (const { watcher, value } of parsed) watcher.handler.apply(value);
  }

  private decode(typeUrl: XdsTypeUrl, response: DiscoveryResponse): Map<string, unknown> {
    const resources = new Map<string, unknown>();
    for (const any of response.resources ?? []) {
      if (any.type_url !== typeUrl)
        throw new Error(`a resource of type ${String(any.type_url)} in a ${typeUrl} response`);
      const json = this.api.decode(XDS_TYPE_NAMES[typeUrl], any.value ?? new Uint8Array()) as Record<string, unknown>;
      resources.set(
        typeof json['name'] === 'string'
          ? json['name']
          : typeof json['cluster_name'] === 'string'
            ? json['cluster_name']
            : '',
        json,
      );
    }
    return resources;
  }
}
