import { CLIENT_FLOW_CONTROL_OPTIONS, DEFAULT_MAX_MESSAGE_BYTES, messageLimits } from './flow-control';
import type { DescMethod, DescService } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { type RequestContext, requestContext, spans } from '@infermesh/telemetry';
import {
  CARRIER_RENEW_MS,
  CarriedCalls,
  type CarriedRequest,
  type CarriedResponse,
  carriedMessageBytes,
  carrierMethods,
  carriesCancellation,
} from './carried-calls';
import { boundedDeadline } from './deadline';
import type { CallOptions, ServiceClient } from './method-types';
import { Errors, RpcError, isServiceError } from './rpc-error';
import { toServiceDefinition } from './service-definition';
import { channelCredentials, secureChannelOptions, type TransportSecurity } from './transport-security';

export interface ClientOptions {
  /** Largest message sent or accepted, in bytes. */
  maxMessageBytes?: number;
  /** Extra grpc-js channel options (service config, keepalive...). */
  channelOptions?: grpc.ChannelOptions;
  /** With mutual TLS, the mesh service the server must prove to be (its SPIFFE ID); `xds:///<service>` targets name it themselves. */
  peer?: string;
  /**
   * The identity to present: the process's own (unset: configureTransportSecurity), this one (a
   * supervisor's), or none (null: plaintext, to a public port).
   */
  transport?: TransportSecurity | null;
}

/**
 * A typed client of a generated service over grpc-js. Each call carries the ambient request id, and
 * its deadline is the earliest of the call's own and the ambient request's, so a budget shrinks as it
 * travels; a call whose budget is already spent fails with DEADLINE_EXCEEDED without being sent, and
 * one beyond MAX_DEADLINE_MS is sent with MAX_DEADLINE_MS.
 * Failed calls reject with RpcError, ErrorInfo included.
 */
let xdsRegistered = false;

/**
 * `xds:///<service>` targets resolve through the mesh's control plane (gRPC's proxyless xDS, with
 * the bootstrap in GRPC_XDS_BOOTSTRAP_CONFIG): registered on first use.
 */
function registerXdsOnce(address: string): void {
  if (xdsRegistered || !address.startsWith('xds:')) return;
  // Loaded only by processes that dial through the mesh: it brings Envoy's protos with it.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  (require('@grpc/grpc-js-xds') as { register: () => void }).register();
  xdsRegistered = true;
}

export function createClient<S extends DescService>(
  service: S,
  address: string,
  options: ClientOptions & {
    /**
     * Unary methods whose calls go carried on a stream method of the service (carried-calls.ts),
     * by the unary method's local name: `{ lookup: 'lookups' }`.
     */
    carried?: Partial<Record<keyof S['method'] & string, keyof S['method'] & string>>;
  } = {},
): ServiceClient<S> {
  registerXdsOnce(address);
  const Ctor = grpc.makeGenericClientConstructor(toServiceDefinition(service), service.typeName);
  const client = new Ctor(address, channelCredentials(address, options.peer, options.transport), {
    ...messageLimits(options.maxMessageBytes),
    // An upstream that restarts is reached again within about a second, not grpc-js's default of
    // up to two minutes of reconnect backoff.
    'grpc.initial_reconnect_backoff_ms': 200,
    'grpc.max_reconnect_backoff_ms': 1_000,
    ...CLIENT_FLOW_CONTROL_OPTIONS,
    ...secureChannelOptions(address, options.peer, options.transport),
    ...options.channelOptions,
  });
  const carriers: CarriedCalls[] = [];
  const result: Record<string, unknown> = {
    close: () => {
      for (const carrier of carriers) carrier.close();
      client.close();
    },
    connect: () => void client.getChannel().getConnectivityState(true),
  };
  for (const method of service.methods) {
    result[method.localName] = clientMethod(client, method);
  }
  const raw = client as unknown as RawClient;
  for (const [unaryName, streamName] of Object.entries(options.carried ?? {}) as [string, string][]) {
    const { stream, unary } = carrierMethods(service, streamName, unaryName);
    const carrier = new CarriedCalls(
      unary,
      () =>
        raw[streamName]!.call(client, new grpc.Metadata(), {}) as grpc.ClientDuplexStream<
          CarriedRequest,
          CarriedResponse
        >,
      deadlineOf,
      CARRIER_RENEW_MS,
      carriedMessageBytes(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES),
      carriesCancellation(stream),
      // A large request goes as a call of its own (CARRIED_CALL_MAX_BYTES).
      result[unaryName] as (request: unknown, options?: CallOptions) => Promise<unknown>,
    );
    carriers.push(carrier);
    result[unaryName] = (request: unknown, callOptions?: CallOptions) => carrier.call(request, callOptions);
  }
  return result as ServiceClient<S>;
}

/**
 * A call's deadline: the earliest of its own (deadlineMs, timeoutMs) and the ambient request's;
 * undefined when none is set. Throws DEADLINE_EXCEEDED when it has passed: the call is not made.
 */
function deadlineOf(options: CallOptions | undefined, ambient: RequestContext | undefined): number | undefined {
  const candidates = [options?.deadlineMs, ambient?.deadlineMs];
  if (options?.timeoutMs !== undefined) candidates.push(Date.now() + options.timeoutMs);
  const deadlines = candidates.filter((d): d is number => d !== undefined && !Number.isNaN(d));
  if (deadlines.length === 0) return undefined;
  const deadline = Math.min(...deadlines);
  if (deadline <= Date.now()) {
    throw Errors.deadlineExceeded('the request deadline passed before the call was made');
  }
  return deadline;
}

interface Prepared {
  metadata: grpc.Metadata;
  callOptions: grpc.CallOptions;
  signal: AbortSignal | undefined;
}

function prepare(options: CallOptions | undefined): Prepared {
  const ambient = requestContext.current();
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(options?.metadata ?? {})) metadata.set(key, value);
  const requestId = options?.metadata?.['x-request-id'] ?? ambient?.requestId;
  if (requestId !== undefined) metadata.set('x-request-id', requestId);
  const deadline = deadlineOf(options, ambient);
  const callOptions: grpc.CallOptions = {};
  if (deadline !== undefined) {
    // grpc-js cannot send a deadline beyond ~11,000 years (it throws outside any call), and a peer
    // cannot time more than ~24.8 days: a longer one is sent as MAX_DEADLINE_MS.
    callOptions.deadline = boundedDeadline(deadline);
  }
  // A call made for a sampled request carries its trace context: the callee's span is a child of
  // this hop's. One span per hop (the callee's server span): a client span on each side of every
  // internal call would double the spans of a request, and the cost of tracing, for the network
  // time between two processes on a host or in a pod network.
  const headers = ambient?.span === undefined ? undefined : spans.propagate(ambient.span);
  if (headers !== undefined) {
    metadata.set('traceparent', headers.traceparent);
    if (headers.tracestate !== undefined) metadata.set('tracestate', headers.tracestate);
  }
  // A call made for a request is cancelled when that request is: the cancellation travels upstream.
  return { metadata, callOptions, signal: options?.signal ?? ambient?.signal };
}

function rethrow(error: unknown): never {
  throw isServiceError(error) ? RpcError.fromServiceError(error) : error;
}

function linkAbort(signal: AbortSignal | undefined, call: grpc.Call): () => void {
  if (signal === undefined) return () => undefined;
  const cancel = () => call.cancel();
  if (signal.aborted) cancel();
  signal.addEventListener('abort', cancel, { once: true });
  return () => signal.removeEventListener('abort', cancel);
}

type RawClient = Record<string, (...args: unknown[]) => grpc.Call>;

function clientMethod(client: Record<string, unknown>, method: DescMethod) {
  const raw = client as RawClient;
  const name = method.localName;
  switch (method.methodKind) {
    case 'unary':
      return (request: unknown, options?: CallOptions) =>
        new Promise((resolve, reject) => {
          const { metadata, callOptions, signal } = prepare(options);
          const call = raw[name]!.call(
            client,
            request,
            metadata,
            callOptions,
            (error: grpc.ServiceError | null, response: unknown) => {
              unlink();
              if (error) reject(RpcError.fromServiceError(error));
              else resolve(response);
            },
          );
          const unlink = linkAbort(signal, call);
        });
    case 'server_streaming':
      return (request: unknown, options?: CallOptions) => ({
        async *[Symbol.asyncIterator]() {
          const { metadata, callOptions, signal } = prepare(options);
          const call = raw[name]!.call(client, request, metadata, callOptions) as grpc.ClientReadableStream<unknown>;
          const unlink = linkAbort(signal, call);
          try {
            for await (const message of call) yield message;
          } catch (error) {
            rethrow(error);
          } finally {
            unlink();
            call.cancel();
          }
        },
      });
    case 'client_streaming':
      return async (requests: AsyncIterable<unknown>, options?: CallOptions) => {
        const { metadata, callOptions, signal } = prepare(options);
        let call!: grpc.ClientWritableStream<unknown>;
        const done = new Promise((resolve, reject) => {
          call = raw[name]!.call(client, metadata, callOptions, (error: grpc.ServiceError | null, response: unknown) =>
            error ? reject(RpcError.fromServiceError(error)) : resolve(response),
          ) as grpc.ClientWritableStream<unknown>;
        });
        // The call may fail while the requests are still being produced; it is awaited below.
        // Once the server has answered (a refusal, typically), the rest of the requests is not read.
        let settled = false;
        const answered = done.then(
          () => (settled = true),
          () => (settled = true),
        );
        const unlink = linkAbort(signal, call);
        try {
          for await (const message of requests) {
            if (settled) break;
            if (!call.write(message))
              await Promise.race([new Promise((resolve) => call.once('drain', resolve)), answered]);
          }
          if (!settled) call.end();
        } catch (error) {
          call.cancel();
          unlink();
          await done.catch(() => undefined);
          throw error;
        }
        try {
          return await done;
        } finally {
          unlink();
        }
      };
    case 'bidi_streaming':
      // Only as the carrier of a unary method's calls (ClientOptions.carried).
      return () => {
        throw new Error(`${method.parent.typeName}.${method.name}: bidirectional streaming is not supported`);
      };
  }
}
