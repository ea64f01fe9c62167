import { create, type DescMethod, type DescService } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { type Clock, type OverdueCause, OverdueSweep, systemClock } from '@infermesh/clock';
import {
  type JsonLogger,
  LATENCY_BUCKETS_SECONDS,
  type Metrics,
  type RequestContext,
  requestContext,
  rpcAttributes,
  sanitizeRequestId,
  spans,
} from '@infermesh/telemetry';
import type { Attributes, Span } from '@opentelemetry/api';
import {
  constants as http2Constants,
  type Http2Server,
  type ServerOptions as Http2ServerOptions,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
} from 'node:http2';
import type { TLSSocket } from 'node:tls';
import type { Counter, Histogram } from 'prom-client';
import {
  type CarriedCall,
  CarriedOutbox,
  type CarriedRequest,
  type CarriedResponse,
  type CarriedResult,
  carriedMessageBytes,
  carrierMethods,
} from './carried-calls';
import { boundTimeoutHeader, delayUntil } from './deadline';
import { messageLimits, openServerWindows } from './flow-control';
import type { CallContext, ServiceImpl } from './method-types';
import { Errors, type RpcError, toRpcError } from './rpc-error';
import { encodedSize } from './message-encoding';
import { MalformedMessage, methodPath, receivedBytes, toServiceDefinition } from './service-definition';
import { serverCredentials, spiffeIdOf } from './transport-security';

export interface GrpcServerOptions {
  logger: JsonLogger;
  metrics: Metrics;
  /** Largest message accepted or sent, in bytes. */
  maxMessageBytes: number;
  /** Whether setInboundFaults may turn fault injection on (in the mesh): off, calls skip the filter. */
  faultInjection?: boolean;
  /**
   * With mutual TLS: every call but health checks is refused (UNAVAILABLE, so callers retry) until
   * setInboundAuthorization gives the rules, then allowed only as they say (PERMISSION_DENIED).
   */
  authorization?: boolean;
  /** The port faces clients outside the mesh (the gateway's public API): plaintext, whatever the process's transport security. */
  public?: boolean;
  /**
   * A unary call's request must have arrived whole this long after its headers, else the call is
   * answered DEADLINE_EXCEEDED and its stream closed: a client that opens calls and never sends their
   * message would otherwise hold each one, and the memory it takes, for as long as it keeps its
   * connection. Unset: no bound (a mesh service, whose callers are the other services).
   */
  receiveTimeoutMs?: number;
  /**
   * With receiveTimeoutMs: the most unary calls, all connections together, whose request has not
   * arrived whole. A call past it makes room: the call waiting longest is answered RESOURCE_EXHAUSTED
   * (OVERLOADED) and its stream closed. The per-connection limit (maxConcurrentStreams) and the
   * timeout alone let many connections hold calls they never send, each a few KiB, by the hundred
   * thousand. A call whose message follows its headers at once is never the one waiting longest;
   * one still receiving a large message slowly may be, while such calls flood in.
   */
  maxCallsAwaitingRequest?: number;
  /**
   * A unary call's answer must have left whole this long after it began (its response headers sent),
   * else its stream is reset (RST_STREAM CANCEL) and the answer dropped: a client that sends calls and
   * never reads their answers (an HTTP/2 window it never opens) would otherwise hold each answer, and
   * the call's memory, for as long as it keeps its connection, however little the answer. Unset: no
   * bound (a mesh service).
   */
  sendTimeoutMs?: number;
  /** The most calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). Unset: HTTP/2's default, unbounded. */
  maxConcurrentStreams?: number;
  /** Time: the shutdown grace period, injected delays, how often a refused handshake is logged, the receive timeout (systemClock unless given). */
  clock?: Clock;
}

/** Health checks are answered whoever asks: probes and supervisors carry no business identity. */
const HEALTH_PREFIX = '/grpc.health.v1.Health/';
/** The retry delay a call given up for maxCallsAwaitingRequest suggests: room comes back as calls arrive whole. */
const EVICTED_RETRY_DELAY_MS = 1_000;

/**
 * Faults the server injects into calls it receives, as the mesh policy's inboundFault says (the
 * same HTTP fault filter an Envoy sidecar would run on its inbound listener).
 */
export interface InboundFaults {
  /** A share of calls answered at once, before their handler runs, with this status (trailers only: callers may retry). */
  abort?: { code: grpc.status; percent: number };
  /** A share of calls held this long before their handler runs. */
  delay?: { ms: number; percent: number };
  /** Whether a call to this method path takes faults (health checks do not). */
  appliesTo: (path: string) => boolean;
}

/**
 * Who may call what on this server, by the caller's identity (the SPIFFE ID of its client
 * certificate): the mesh policy's authorization, as the RBAC filter of the service's inbound listener.
 */
export interface InboundAuthorization {
  /** Whether a caller with this identity (undefined: no certificate) may call this method path (`/pkg.Service/Method`). */
  allows(identity: string | undefined, path: string): boolean;
  /** The rules in words, for a refusal's message ("router is called by gateway"). */
  describe(): string;
}

type AnyCall = Pick<grpc.ServerUnaryCall<unknown, unknown>, 'metadata' | 'getDeadline'> & NodeJS.EventEmitter;

/**
 * A grpc-js server that hosts services generated by protoc-gen-es: it runs each handler inside the
 * request's context (request id and deadline), turns thrown errors into canonical statuses with
 * ErrorInfo, records a duration histogram per RPC, and shuts down gracefully. Whatever a handler
 * throws, synchronously or not, fails that one call (INTERNAL, logged), never the process; a
 * deadline beyond MAX_DEADLINE_MS is received as MAX_DEADLINE_MS.
 */
export class GrpcServer {
  private readonly server: grpc.Server;
  private readonly duration: Histogram<'method' | 'code'>;
  private draining = false;
  private faults: InboundFaults | undefined;
  private authorization: InboundAuthorization | undefined;
  /** The SPIFFE ID of each TLS connection's peer, by its remote address and port. */
  private readonly peers = new Map<string, string | undefined>();
  private readonly injected: Counter<'method' | 'fault'>;
  private readonly refused: Counter<'method' | 'caller'>;
  private readonly handshakeFailures: Counter<'reason'>;
  private shed: ((path: string) => RpcError | undefined) | undefined;
  /** The trailers of each shedding error: one error object stands for many refusals. */
  private readonly shedTrailers = new WeakMap<RpcError, OutgoingHttpHeaders>();

  private readonly clock: Clock;
  /** The streams carrying calls, each by what ends it once its calls are answered (shutdown). */
  private readonly carriers = new Set<() => void>();
  /** The paths of unary methods: the calls whose request receiveTimeoutMs bounds. */
  private readonly unaryPaths = new Set<string>();
  /** Unary calls whose request has not arrived whole yet, from their headers on (receiveTimeoutMs). */
  private readonly awaitingRequest: OverdueSweep<ServerHttp2Stream> | undefined;
  /** Unary calls whose request has arrived and whose stream is still open, from their answer's start on (sendTimeoutMs). */
  private readonly answering: OverdueSweep<ServerHttp2Stream> | undefined;
  private readonly abandoned: Counter<'method'>;
  private readonly evicted: Counter<'method'>;
  /** The answers of calls given up while awaiting their request: overdue (receiveTimeoutMs), or evicted (maxCallsAwaitingRequest). */
  private readonly awaitingAnswers: Record<OverdueCause, RpcError> | undefined;

  constructor(private readonly options: GrpcServerOptions) {
    this.clock = options.clock ?? systemClock;
    if (options.receiveTimeoutMs !== undefined) {
      this.awaitingRequest = new OverdueSweep(this.clock, options.receiveTimeoutMs, options.maxCallsAwaitingRequest);
      this.awaitingAnswers = {
        timeout: Errors.deadlineExceeded(
          `the request did not arrive whole within ${options.receiveTimeoutMs} ms of its headers`,
        ),
        evicted: Errors.overloaded(
          `this server holds its limit of ${options.maxCallsAwaitingRequest} calls whose request has not arrived whole, and this call's had waited longest: send a call's message with its headers`,
          { retryDelayMs: EVICTED_RETRY_DELAY_MS },
        ),
      };
    }
    if (options.sendTimeoutMs !== undefined) this.answering = new OverdueSweep(this.clock, options.sendTimeoutMs);
    this.server = new grpc.Server({
      ...messageLimits(options.maxMessageBytes),
      ...(options.maxConcurrentStreams !== undefined && {
        'grpc.max_concurrent_streams': options.maxConcurrentStreams,
      }),
      // In the mesh, every call passes the inbound filters: authorization, then faults the policy can
      // turn on at run time.
      ...((options.faultInjection === true || options.authorization === true) && {
        interceptors: [
          (descriptor: grpc.ServerMethodDefinition<unknown, unknown>, call: grpc.ServerInterceptingCallInterface) =>
            this.inbound(descriptor.path, call),
        ],
      }),
    });
    this.handshakeFailures = options.metrics.counter(
      'grpc_server_tls_handshake_failures_total',
      'TLS connections refused during the handshake (no client certificate, one from another CA, an expired one), by reason.',
      ['reason'],
    );
    this.refused = options.metrics.counter(
      'grpc_server_unauthorized_calls_total',
      "Calls refused by the mesh policy's authorization (PERMISSION_DENIED), or before it was received (UNAVAILABLE), by method and caller identity.",
      ['method', 'caller'],
    );
    this.abandoned = options.metrics.counter(
      'grpc_server_undelivered_answers_total',
      'Answers dropped because the client had not taken them within the send timeout (it does not read its answers): their streams were reset, by method.',
      ['method'],
    );
    if (this.awaitingRequest !== undefined) {
      const { awaitingRequest } = this;
      options.metrics.gauge(
        'grpc_server_calls_awaiting_request',
        'Unary calls whose request has not arrived whole yet (headers received, message not), all connections together.',
        [],
        (gauge) => gauge.set(awaitingRequest.size),
      );
    }
    this.evicted = options.metrics.counter(
      'grpc_server_requests_evicted_total',
      'Calls answered RESOURCE_EXHAUSTED before their request arrived whole, to make room under the limit of calls awaiting their request: the one waiting longest goes, by method.',
      ['method'],
    );
    this.injected = options.metrics.counter(
      'grpc_server_injected_faults_total',
      "Calls this service failed or delayed on purpose, as the mesh policy's inboundFault says.",
      ['method', 'fault'],
    );
    setStreamGuards(this.server);
    const reported = new Map<string, number>();
    hookHttp2Servers(
      this.server,
      (error, socket) => {
        const reason = error.code ?? error.message;
        this.handshakeFailures.inc({ reason });
        // One line per reason every 10 s: a scanner must not flood the log.
        const last = reported.get(reason);
        const now = this.clock.monotonic();
        if (last !== undefined && now - last < 10_000) return;
        reported.set(reason, now);
        options.logger.warn('refused a TLS connection: the peer did not prove a mesh identity', {
          reason,
          peer: `${socket.remoteAddress}:${socket.remotePort}`,
          err: error.message,
        });
      },
      (socket) => {
        // The peer's identity, read once per connection: reading the certificate on every call costs
        // more than the rest of the authorization.
        const key = `${socket.remoteAddress}:${socket.remotePort}`;
        this.peers.set(key, spiffeIdOf(socket.getPeerCertificate()));
        socket.once('close', () => this.peers.delete(key));
      },
      (stream, headers) => this.refuseEarly(stream, headers),
      (stream, headers) => this.awaitRequest(stream, headers),
    );
    this.duration = options.metrics.histogram(
      'grpc_server_handling_seconds',
      'Duration of gRPC calls handled by this service, by method and status code.',
      ['method', 'code'],
      LATENCY_BUCKETS_SECONDS,
      { exemplars: true },
    );
  }

  /**
   * Sheds load before grpc-js reads a call: each call's method path goes to `refusal`, and a call it
   * returns an error for is answered at once with that status (trailers only), its message neither
   * read nor decoded, no handler, interceptor or call object made for it. What a refusal costs is
   * then the HTTP/2 stream alone: a server refusing most of what it receives (overload) keeps its CPU
   * for what it admits. Each shed call is recorded in grpc_server_handling_seconds.
   */
  shedWith(refusal: (path: string) => RpcError | undefined): this {
    this.shed = refusal;
    return this;
  }

  private refuseEarly(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean {
    const path = headers[':path'];
    const error = this.shed === undefined || typeof path !== 'string' ? undefined : this.shed(path);
    if (error === undefined) return false;
    const start = process.hrtime.bigint();
    if (!this.answerAtOnce(stream, error)) return true;
    this.options.metrics.observe(
      this.duration,
      { method: methodLabel(path!), code: grpc.status[error.code] ?? String(error.code) },
      Number(process.hrtime.bigint() - start) / 1e9,
    );
    return true;
  }

  /**
   * Answers a call with `error`'s status, trailers only, its request (if the client still sends one)
   * read and dropped; false when the stream was already gone. The trailers are kept by error: one
   * error object stands for many such answers.
   */
  private answerAtOnce(stream: ServerHttp2Stream, error: RpcError): boolean {
    let trailers = this.shedTrailers.get(error);
    if (trailers === undefined) {
      const { code, details, metadata } = error.toStatus();
      trailers = {
        ':status': 200,
        'content-type': 'application/grpc+proto',
        'grpc-status': String(code),
        'grpc-message': encodeURI(details ?? ''),
        ...metadata?.toHttp2Headers(),
      };
      this.shedTrailers.set(error, trailers);
    }
    stream.on('error', () => undefined);
    if (stream.destroyed) return false;
    stream.resume();
    if (!stream.headersSent) stream.respond(trailers, { endStream: true });
    return true;
  }

  /**
   * Notes a unary call's headers, to answer it DEADLINE_EXCEEDED if its request is not whole within
   * receiveTimeoutMs, and then to reset its stream if its answer has not left within sendTimeoutMs.
   */
  private awaitRequest(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): void {
    const { awaitingRequest, answering } = this;
    if (awaitingRequest === undefined && answering === undefined) return;
    const path = headers[':path'];
    if (typeof path !== 'string' || !this.unaryPaths.has(path)) return;
    awaitingRequest?.watch(stream, (cause) => this.stopAwaiting(stream, path, cause));
    stream.once('end', () => {
      awaitingRequest?.forget(stream);
      if (answering !== undefined && !stream.closed) {
        // A client that never reads (its HTTP/2 window 0) gets headers but no byte: its answer has
        // begun once they are sent, and must have left a timeout later.
        answering.watch(
          stream,
          () => this.answerOverdue(stream, path),
          () => stream.headersSent,
        );
      }
    });
    stream.once('close', () => {
      awaitingRequest?.forget(stream);
      answering?.forget(stream);
    });
  }

  /** An answer that has not left within sendTimeoutMs of its start: the client is not reading it. */
  private answerOverdue(stream: ServerHttp2Stream, path: string): void {
    if (stream.destroyed) return;
    stream.close(http2Constants.NGHTTP2_CANCEL);
    this.abandoned.inc({ method: methodLabel(path) });
  }

  /**
   * A call whose request has not arrived whole, given up: overdue, or evicted (it waited longest when
   * another came past maxCallsAwaitingRequest). Answered at once, and its stream closed.
   */
  private stopAwaiting(stream: ServerHttp2Stream, path: string, cause: OverdueCause): void {
    const error = this.awaitingAnswers![cause];
    if (!this.answerAtOnce(stream, error)) return;
    // The client may still be sending: the stream is reset so that it stops, and its memory is freed.
    stream.close(http2Constants.NGHTTP2_NO_ERROR);
    const method = methodLabel(path);
    const waitedS = cause === 'evicted' ? 0 : this.awaitingRequest!.timeoutMs / 1000;
    this.options.metrics.observe(this.duration, { method, code: grpc.status[error.code] }, waitedS);
    if (cause === 'evicted') this.evicted.inc({ method });
  }

  /**
   * Hosts a service. `carried` names the stream methods that carry a unary method's calls
   * (carried-calls.ts), by the stream method's local name: `{ lookups: 'lookup' }`. Each is served
   * from the unary method's handler, and has none of its own.
   */
  add<S extends DescService, C extends keyof S['method'] & string = never>(
    service: S,
    impl: Omit<ServiceImpl<S>, C>,
    carried?: Record<C, keyof S['method'] & string>,
  ): this {
    const definition = toServiceDefinition(service);
    const handlers: Record<string, grpc.UntypedHandleCall> = {};
    const handlerOf = (method: DescMethod) => {
      const handler = (impl as Record<string, unknown>)[method.localName];
      if (typeof handler !== 'function') throw new Error(`${service.typeName}.${method.name} has no handler`);
      return (handler as (...args: unknown[]) => unknown).bind(impl);
    };
    for (const method of service.methods) {
      if (method.methodKind === 'unary') this.unaryPaths.add(methodPath(method));
      const carries = (carried as Record<string, string> | undefined)?.[method.localName];
      if (carries === undefined) {
        handlers[method.localName] = this.wrap(method, handlerOf(method));
        continue;
      }
      const { unary } = carrierMethods(service, method.localName, carries);
      handlers[method.localName] = this.carrier(method, unary, handlerOf(unary));
    }
    this.server.addService(definition, handlers);
    return this;
  }

  /**
   * Hosts a service whose messages are not generated from proto/ (Envoy's xDS, served as Envoy's
   * protos define it), with its own serializers and handlers; the caller guards its handlers.
   */
  addUntyped(definition: grpc.ServiceDefinition, implementation: grpc.UntypedServiceImplementation): this {
    this.server.addService(definition, implementation);
    return this;
  }

  async listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.bindAsync(
        `${host}:${port}`,
        this.options.public === true ? grpc.ServerCredentials.createInsecure() : serverCredentials(),
        (error, bound) => (error ? reject(error) : resolve(bound)),
      );
    });
  }

  /**
   * Stops accepting calls, lets in-flight calls finish within graceMs, then cancels the rest. A
   * stream carrying calls answers those it has received, refuses any more, and ends.
   */
  async shutdown(graceMs: number): Promise<void> {
    this.draining = true;
    this.awaitingRequest?.close();
    this.answering?.close();
    for (const drain of this.carriers) drain();
    await new Promise<void>((resolve) => {
      const cancel = this.clock.setTimer(() => {
        this.server.forceShutdown();
        resolve();
      }, graceMs);
      this.server.tryShutdown(() => {
        cancel();
        resolve();
      });
    });
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /** Faults to inject into the calls received from now on; undefined: none. */
  setInboundFaults(faults: InboundFaults | undefined): void {
    this.faults = faults;
  }

  /** The rules calls are allowed by from now on (the policy's, as its inbound listener says). */
  setInboundAuthorization(authorization: InboundAuthorization): void {
    this.authorization = authorization;
  }

  private inbound(path: string, call: grpc.ServerInterceptingCallInterface): grpc.ServerInterceptingCall {
    if (this.options.authorization === true && !path.startsWith(HEALTH_PREFIX)) {
      const refusal = this.authorize(path, call);
      if (refusal !== undefined) {
        return new grpc.ServerInterceptingCall(call, {
          start: (next) =>
            next({ onReceiveMetadata: () => call.sendStatus({ ...refusal, metadata: new grpc.Metadata() }) }),
        });
      }
    }
    return this.injectFaults(path, call);
  }

  /** Why the caller may not make this call; undefined: it may. */
  private authorize(
    path: string,
    call: grpc.ServerInterceptingCallInterface,
  ): { code: grpc.status; details: string } | undefined {
    const { remoteAddress, remotePort } = call.getConnectionInfo();
    const caller =
      this.peers.get(`${remoteAddress}:${remotePort}`) ?? spiffeIdOf(call.getAuthContext().sslPeerCertificate);
    const method = methodLabel(path);
    const authorization = this.authorization;
    if (authorization === undefined) {
      this.refused.inc({ method, caller: caller ?? '(none)' });
      return {
        code: grpc.status.UNAVAILABLE,
        details: 'this service has not received its authorization policy from the mesh yet; retry',
      };
    }
    if (authorization.allows(caller, path)) return undefined;
    this.refused.inc({ method, caller: caller ?? '(none)' });
    return {
      code: grpc.status.PERMISSION_DENIED,
      details: `${caller ?? 'a caller without a certificate'} may not call ${path} (${authorization.describe()})`,
    };
  }

  private injectFaults(path: string, call: grpc.ServerInterceptingCallInterface): grpc.ServerInterceptingCall {
    const faults = this.faults;
    if (faults === undefined || !faults.appliesTo(path)) return new grpc.ServerInterceptingCall(call);
    const abort = faults.abort !== undefined && Math.random() * 100 < faults.abort.percent ? faults.abort : undefined;
    const delayMs = faults.delay !== undefined && Math.random() * 100 < faults.delay.percent ? faults.delay.ms : 0;
    if (abort === undefined && delayMs === 0) return new grpc.ServerInterceptingCall(call);
    const method = methodLabel(path);
    return new grpc.ServerInterceptingCall(call, {
      start: (next) => {
        next({
          onReceiveMetadata: (metadata, nextMetadata) => {
            const go = () => {
              if (abort === undefined) return nextMetadata(metadata);
              this.injected.inc({ method, fault: 'abort' });
              call.sendStatus({
                code: abort.code,
                details: `injected fault: the mesh policy fails ${abort.percent}% of calls here`,
                metadata: new grpc.Metadata(),
              });
            };
            if (delayMs === 0) return go();
            this.injected.inc({ method, fault: 'delay' });
            this.clock.setTimer(go, delayMs);
          },
        });
      },
    });
  }

  /** Records a call that ended: its duration by method and code, and its span. */
  private finished(name: string, start: bigint, code: grpc.status, callSpan?: Span, message?: string): void {
    this.options.metrics.observe(
      this.duration,
      { method: name, code: grpc.status[code] ?? String(code) },
      Number(process.hrtime.bigint() - start) / 1e9,
      callSpan,
    );
    spans.endCall(callSpan, code, message);
  }

  /** Records a call that failed (logged when INTERNAL: the server's own fault) and gives its error. */
  private failed(name: string, start: bigint, error: unknown, callSpan?: Span): RpcError {
    const rpcError = toRpcError(error);
    if (rpcError.code === grpc.status.INTERNAL) {
      this.options.logger.error(`${name} failed`, error instanceof Error ? error : new Error(String(error)));
    }
    this.finished(name, start, rpcError.code, callSpan, rpcError.message);
    return rpcError;
  }

  /** Answering a call threw (grpc-js could not send it): logged; the call ends without an answer of ours. */
  private answerFailed(name: string, error: unknown): void {
    this.options.logger.error(
      `${name}: the answer could not be sent`,
      error instanceof Error ? error : new Error(String(error)),
    );
  }

  private wrap(method: DescMethod, handler: (...args: unknown[]) => unknown): grpc.UntypedHandleCall {
    const name = `${method.parent.name}/${method.name}`;
    // The span of each call, named and described as the RPC semantic conventions say; health checks
    // (probes, supervisors) belong to no request and make none.
    const path = `/${method.parent.typeName}/${method.name}`;
    const span = path.startsWith(HEALTH_PREFIX) ? undefined : { name: path.slice(1), attributes: rpcAttributes(path) };
    const finish = (start: bigint, code: grpc.status, callSpan?: Span) => this.finished(name, start, code, callSpan);
    const fail = (start: bigint, error: unknown, callSpan?: Span): Partial<grpc.ServiceError> =>
      this.failed(name, start, error, callSpan).toStatus();
    const answerFailed = (error: unknown) => this.answerFailed(name, error);
    /** Runs a call's work in its context, then answers with its response or its error (unary and client streaming). */
    const respond = (
      start: bigint,
      call: AnyCall,
      callback: grpc.sendUnaryData<unknown>,
      work: (ctx: CallContext) => Promise<unknown>,
    ) => {
      let dispose = () => undefined as unknown;
      let callSpan: Span | undefined;
      guarded(() => {
        const { ctx, context, dispose: disposeCall } = this.callContext(call, span);
        dispose = disposeCall;
        callSpan = context.span;
        return requestContext.run(context, () => work(ctx));
      })
        .then(
          (response) => {
            finish(start, grpc.status.OK, callSpan);
            callback(null, response);
          },
          (error: unknown) => callback(fail(start, error, callSpan)),
        )
        .catch(answerFailed)
        .finally(() => dispose());
    };
    /** Runs a call's work in its context, then ends its response stream, or fails it (server and bidirectional streaming). */
    const stream = (
      start: bigint,
      call: grpc.ServerWritableStream<unknown, unknown> | grpc.ServerDuplexStream<unknown, unknown>,
      work: (ctx: CallContext) => Promise<void>,
    ) => {
      let dispose = () => undefined as unknown;
      let callSpan: Span | undefined;
      guarded(() => {
        const { ctx, context, dispose: disposeCall } = this.callContext(call, span);
        dispose = disposeCall;
        callSpan = context.span;
        return requestContext.run(context, () => work(ctx));
      })
        .then(
          () => {
            finish(start, grpc.status.OK, callSpan);
            call.end();
          },
          (error: unknown) => call.emit('error', fail(start, error, callSpan)),
        )
        .catch(answerFailed)
        .finally(() => dispose());
    };

    switch (method.methodKind) {
      case 'unary':
        return (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => {
          const start = process.hrtime.bigint();
          if (call.request instanceof MalformedMessage) {
            callback(fail(start, call.request.toError()));
            return;
          }
          respond(start, call, callback, (ctx) => handler(call.request, ctx) as Promise<unknown>);
        };
      case 'server_streaming':
        return (call: grpc.ServerWritableStream<unknown, unknown>) => {
          const start = process.hrtime.bigint();
          if (call.request instanceof MalformedMessage) {
            call.emit('error', fail(start, call.request.toError()));
            return;
          }
          stream(start, call, (ctx) =>
            writeAll(call, handler(call.request, ctx) as AsyncIterable<unknown>, ctx.signal),
          );
        };
      case 'client_streaming':
        return (call: grpc.ServerReadableStream<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => {
          respond(
            process.hrtime.bigint(),
            call,
            callback,
            (ctx) => handler(requestsOf(call, ctx.signal), ctx) as Promise<unknown>,
          );
        };
      case 'bidi_streaming':
        return (call: grpc.ServerDuplexStream<unknown, unknown>) => {
          // The handler may stop reading requests and go on answering: its request stream must not
          // take the call (whose writable side is the same stream) down with it.
          stream(process.hrtime.bigint(), call, (ctx) =>
            writeAll(
              call,
              handler(requestsOf(call, ctx.signal, { destroyOnReturn: false }), ctx) as AsyncIterable<unknown>,
              ctx.signal,
            ),
          );
        };
    }
  }

  /**
   * Serves the calls of `unary` that streams of `stream` carry (carried-calls.ts): each call as a call
   * of its own (the unary handler in its context, its span from the trace context it carries, its
   * duration and code under the unary method's name), answered on the stream by id as it ends, the
   * answers of one turn of the event loop together. The stream itself is recorded under its own name
   * when it ends: when the client ends it, once every call received is answered; when the server
   * shuts down, the same, calls received meanwhile refused with SHUTTING_DOWN. A message that does not
   * decode fails the stream (INVALID_ARGUMENT): it names no call to fail.
   */
  private carrier(
    stream: DescMethod,
    unary: DescMethod,
    handler: (...args: unknown[]) => unknown,
  ): grpc.UntypedHandleCall {
    const streamName = `${stream.parent.name}/${stream.name}`;
    const name = `${unary.parent.name}/${unary.name}`;
    const path = `/${unary.parent.typeName}/${unary.name}`;
    const attributes = rpcAttributes(path);
    const empty = create(unary.input);
    return (call: grpc.ServerDuplexStream<CarriedRequest, CarriedResponse>) => {
      const start = process.hrtime.bigint();
      /** Each call received and not yet answered, by id: what cancels it (the client gave it up). */
      const inFlight = new Map<number, (reason: RpcError) => void>();
      let receiving = true;
      let ended = false;
      const outbox = new CarriedOutbox<CarriedResult>((results) => {
        if (ended) return;
        try {
          call.write({ results });
        } catch (error) {
          this.answerFailed(name, error);
        }
      }, carriedMessageBytes(this.options.maxMessageBytes));
      /** Queues an answer; one that cannot be encoded is answered with the error instead. */
      const send = (result: CarriedResult) => {
        if (result.response === undefined) {
          outbox.push(result, 0); // a status: small against what answers carry
          return;
        }
        try {
          const response = create(unary.output, result.response as never);
          outbox.push({ ...result, response }, encodedSize(unary.output, response));
        } catch (error) {
          this.answerFailed(name, error);
          outbox.push({ id: result.id, status: toRpcError(error).toRpcStatus() }, 0);
        }
      };
      const end = (error?: RpcError) => {
        if (ended) return;
        if (error === undefined) outbox.flush();
        ended = true;
        this.carriers.delete(drain);
        if (error === undefined) {
          this.finished(streamName, start, grpc.status.OK);
          call.end();
        } else {
          call.emit('error', this.failed(streamName, start, error).toStatus());
        }
      };
      const drain = () => {
        receiving = false;
        if (inFlight.size === 0) end();
      };
      this.carriers.add(drain);
      call.once('cancelled', () => {
        const wasEnded = ended;
        ended = true; // nothing more is sent on it
        const cancelled = Errors.cancelled('the client cancelled the stream');
        for (const cancel of [...inFlight.values()]) cancel(cancelled);
        if (!wasEnded) {
          this.carriers.delete(drain);
          this.finished(streamName, start, grpc.status.CANCELLED);
        }
      });
      const serve = (message: CarriedCall) => {
        if (ended) return;
        if (!receiving) {
          const refusal = Errors.shuttingDown('the server is shutting down; call again on a new stream');
          send({ id: message.id, status: refusal.toRpcStatus() });
          return;
        }
        if (inFlight.has(message.id)) {
          const duplicate = Errors.invalidRequest(`call ${message.id} is already in flight on this stream`);
          send({ id: message.id, status: duplicate.toRpcStatus() });
          return;
        }
        const callStart = process.hrtime.bigint();
        const requestId = sanitizeRequestId(message.requestId === '' ? undefined : message.requestId);
        const deadlineMs = message.timeoutMs > 0 ? Date.now() + message.timeoutMs : undefined;
        const span =
          spans.enabled && message.traceparent !== ''
            ? spans.server(
                path.slice(1),
                {
                  traceparent: message.traceparent,
                  ...(message.tracestate !== '' && { tracestate: message.tracestate }),
                },
                attributes,
                false,
              )
            : undefined;
        // Its own signal, as a call's: aborted when its deadline passes (it is then answered
        // DEADLINE_EXCEEDED, whatever its handler does later) or the stream is cancelled.
        const signal = new AbortController();
        let settled = false;
        /** Settles the call: its result sent (unless the stream ended), or, given up by the client, only recorded. */
        const answer = (result: () => CarriedResult, sent = true) => {
          if (settled) return;
          settled = true;
          cancelTimer?.();
          inFlight.delete(message.id);
          if (!ended) {
            const answered = result();
            if (sent) send(answered);
          }
          if (!receiving && inFlight.size === 0) end();
        };
        inFlight.set(message.id, (reason) => {
          signal.abort(reason);
          answer(fail(reason), false);
        });
        const fail = (error: unknown) => () => ({
          id: message.id,
          status: this.failed(name, callStart, error, span).toRpcStatus(),
        });
        const cancelTimer =
          deadlineMs === undefined
            ? undefined
            : this.clock.setTimer(() => {
                const expired = Errors.deadlineExceeded(`${name} was not answered within its deadline`);
                signal.abort(expired);
                answer(fail(expired));
              }, delayUntil(deadlineMs));
        const ctx: CallContext = { requestId, deadlineMs, signal: signal.signal, metadata: {} };
        const context: RequestContext = {
          requestId,
          signal: signal.signal,
          ...(deadlineMs !== undefined && { deadlineMs }),
          ...(span !== undefined && { span }),
        };
        guarded(() => requestContext.run(context, () => handler(message.request ?? empty, ctx))).then(
          (response) =>
            answer(() => {
              this.finished(name, callStart, grpc.status.OK, span);
              return { id: message.id, response };
            }),
          (error: unknown) => answer(fail(error)),
        );
      };
      call.on('end', drain);
      call.on('data', (message: CarriedRequest | MalformedMessage) => {
        if (ended) return;
        if (message instanceof MalformedMessage) {
          end(message.toError());
          return;
        }
        for (const carried of message.calls) serve(carried);
        for (const id of message.cancelled ?? []) {
          inFlight.get(id)?.(Errors.cancelled('the client cancelled the call'));
        }
      });
    };
  }

  private callContext(call: AnyCall, spanOf: { name: string; attributes: Attributes } | undefined) {
    const metadata: Record<string, string> = {};
    for (const [key, value] of Object.entries(call.metadata.getMap())) {
      if (typeof value === 'string') metadata[key] = value;
    }
    const requestId = sanitizeRequestId(metadata['x-request-id']);
    const rawDeadline = call.getDeadline();
    const deadlineMs =
      rawDeadline instanceof Date ? rawDeadline.getTime() : Number.isFinite(rawDeadline) ? rawDeadline : undefined;
    const controller = new AbortController();
    const onCancel = () => controller.abort(Errors.cancelled('the call was cancelled'));
    call.once('cancelled', onCancel);
    const bytes = 'request' in call ? receivedBytes(call.request) : undefined;
    const ctx: CallContext = {
      requestId,
      deadlineMs,
      signal: controller.signal,
      metadata,
      ...(bytes !== undefined && { requestBytes: bytes }),
    };
    // Traced when the caller's call is (its traceparent), or always at the public edge.
    const span =
      spans.enabled && spanOf !== undefined
        ? spans.server(
            spanOf.name,
            { traceparent: metadata['traceparent'], tracestate: metadata['tracestate'] },
            spanOf.attributes,
            this.options.public === true,
          )
        : undefined;
    const context: RequestContext = {
      requestId,
      signal: controller.signal,
      ...(deadlineMs !== undefined && { deadlineMs }),
      ...(span !== undefined && { span }),
    };
    return { ctx, context, dispose: () => call.removeListener('cancelled', onCancel) };
  }
}

/** A method path's metric label, as grpc_server_handling_seconds has it: Service/Method. */
function methodLabel(path: string): string {
  const [, service = '', method = ''] = path.split('/');
  return `${service.split('.').at(-1)}/${method}`;
}

/**
 * The promise of a piece of work that may also throw before it returns one, or return something else:
 * a handler's synchronous throw becomes its call's failure instead of an exception inside grpc-js.
 */
async function guarded<T>(work: () => T | Promise<T>): Promise<T> {
  return work();
}

/**
 * Streams over a connection's SETTINGS_MAX_CONCURRENT_STREAMS that Node's HTTP/2 server refuses in a
 * row before it closes the whole connection. Node's default, 100, closes it with GOAWAY
 * (INTERNAL_ERROR), every call in flight on it failing INTERNAL, whenever a client runs at the limit
 * while the server is slow to let go of the streams it has answered: Node counts a stream until its
 * JavaScript object is destroyed, which a busy event loop delays, while the client counts it closed
 * once answered and opens the next. Measured: one client sending twice the gateway's capacity on one
 * connection (`npm run bench -- batching`) lost 33,594 of 43,375 requests so, its connection closed 8
 * times. Past the limit each stream is refused alone (RST_STREAM ENHANCE_YOUR_CALM: grpc-js clients
 * answer the call RESOURCE_EXHAUSTED), as the limit means; a connection that keeps opening streams
 * the server refuses, 10,000 in a row, is still closed.
 */
export const MAX_REFUSED_STREAMS_IN_A_ROW = 10_000;

/**
 * The streams a client may reset (RST_STREAM) on one connection before its HTTP/2 server takes it for
 * the rapid-reset attack (CVE-2023-44487) and closes it (GOAWAY INTERNAL_ERROR, every call on it
 * failed): `burst` at once, then `perSecond`. nghttp2's defaults, which Node applies, are 1,000 and
 * 33 a second, far below what honest clients send: a grpc-js client resets the stream of every call
 * it gives up on (its deadline passed, cancelled), so a client whose deadlines expire through a
 * latency spike resets about as many streams a second as it makes calls. Measured (a bare node:http2
 * server, 4,000 calls at 1,000 a second, every other one cancelled after 20 ms): the connection was
 * closed after about 1,000 resets, and 970 of the calls still waiting on it failed. The work a reset
 * call leaves behind is bounded elsewhere (the gateway's concurrency limit counts a call until its
 * handler ends; its rate limits charge it), so the guard is only to stop a client that resets far more
 * than its calls make: 10,000 at once (ten times the gateway's streams per connection), then 1,000 a
 * second. A client that gives up on a quarter of 4,000 calls a second keeps its connection; one that
 * gives up on nearly all of them for seconds (its calls all failing anyway) loses it, as does one
 * that resets streams as fast as it opens them: a grpc-js server cannot take 10,000 a second on these
 * machines, so a rate that high would never be reached.
 */
export const STREAM_RESETS_ALLOWED = { burst: 10_000, perSecond: 1_000 } as const;

/**
 * Sets the HTTP/2 servers of a grpc-js server's guards against clients that misuse streams: refusing
 * streams over the concurrency limit one by one (MAX_REFUSED_STREAMS_IN_A_ROW) instead of closing the
 * connection, and the resets it takes before it does (STREAM_RESETS_ALLOWED). grpc-js offers no
 * option for them: its server passes its `commonServerOptions` to each HTTP/2 server it creates,
 * which this sets. Throws if that field is gone (a grpc-js version this code does not know).
 */
function setStreamGuards(server: grpc.Server): void {
  const internals = server as unknown as { commonServerOptions?: Http2ServerOptions };
  if (typeof internals.commonServerOptions !== 'object') {
    throw new Error(
      "@grpc/grpc-js has no Server.commonServerOptions: its HTTP/2 servers' stream guards cannot be set; check the grpc-js version",
    );
  }
  Object.assign(internals.commonServerOptions, {
    maxSessionRejectedStreams: MAX_REFUSED_STREAMS_IN_A_ROW,
    streamResetBurst: STREAM_RESETS_ALLOWED.burst,
    streamResetRate: STREAM_RESETS_ALLOWED.perSecond,
  } satisfies Http2ServerOptions);
}

/**
 * Gives `configure` each HTTP/2 server a grpc-js server creates, before it listens. grpc-js offers no
 * hook for it: its server creates its HTTP/2 servers in one method, which this wraps. Throws if that
 * method is gone (a grpc-js version this code does not know).
 */
export function onHttp2Servers(server: grpc.Server, configure: (http2Server: Http2Server) => void): void {
  const internals = server as unknown as { createHttp2Server?: (credentials: unknown) => Http2Server };
  const createHttp2Server = internals.createHttp2Server;
  if (typeof createHttp2Server !== 'function') {
    throw new Error(
      '@grpc/grpc-js has no Server.createHttp2Server: its HTTP/2 servers cannot be configured (deadline bound, flow-control windows, early refusals); check the grpc-js version',
    );
  }
  internals.createHttp2Server = (credentials: unknown) => {
    const http2Server = createHttp2Server.call(server, credentials);
    configure(http2Server);
    return http2Server;
  };
}

/**
 * Bounds the deadline of every call the server receives to MAX_DEADLINE_MS before grpc-js reads it:
 * grpc-js reads `grpc-timeout` into a 32-bit integer, so that 25 to 50 days would expire a call at
 * once. Each HTTP/2 server grpc-js creates gets a first 'stream' listener for it here.
 */
function hookHttp2Servers(
  server: grpc.Server,
  onTlsError: (error: Error & { code?: string }, socket: TLSSocket) => void,
  onSecureConnection: (socket: TLSSocket) => void,
  answeredEarly: (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean,
  received: (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => void,
): void {
  onHttp2Servers(server, (http2Server) => {
    http2Server.prependListener('stream', (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
      boundTimeoutHeader(headers);
      received(stream, headers);
    });
    // A call answered here never reaches grpc-js: its 'stream' event is not passed on.
    const emit = http2Server.emit.bind(http2Server);
    http2Server.emit = (event: string | symbol, ...args: unknown[]): boolean =>
      event === 'stream' && answeredEarly(args[0] as ServerHttp2Stream, args[1] as IncomingHttpHeaders)
        ? true
        : emit(event, ...args);
    openServerWindows(http2Server);
    // A TLS server: a peer refused during the handshake (no certificate, another CA, expired) is reported here.
    http2Server.on('tlsClientError', onTlsError);
    http2Server.on('secureConnection', onSecureConnection);
  });
}

/**
 * The request stream of a client-streaming or bidirectional call. grpc-js ends the stream of a call
 * the client cancelled before it reports the cancellation, so the end is confirmed one turn later: a
 * cancelled upload throws CANCELLED instead of looking complete.
 */
async function* requestsOf(
  call: grpc.ServerReadableStream<unknown, unknown> | grpc.ServerDuplexStream<unknown, unknown>,
  signal: AbortSignal,
  options: { destroyOnReturn: boolean } = { destroyOnReturn: true },
): AsyncGenerator<unknown> {
  const cancelled = () => Errors.cancelled('the client cancelled the call');
  for await (const message of call.iterator(options) as AsyncIterable<unknown>) {
    if (signal.aborted) throw cancelled();
    if (message instanceof MalformedMessage) throw message.toError();
    yield message;
  }
  await new Promise((resolve) => setImmediate(resolve));
  if (signal.aborted || call.cancelled) throw cancelled();
}

/**
 * Writes a handler's responses to its call as they come; while the call's write buffer is full the
 * handler is not read further (it resumes on 'drain'), so responses are produced only as fast as
 * grpc-js sends them. Stops when the call is cancelled, also while waiting for a drain that will
 * not come.
 */
async function writeAll(
  call: grpc.ServerWritableStream<unknown, unknown> | grpc.ServerDuplexStream<unknown, unknown>,
  responses: AsyncIterable<unknown>,
  signal: AbortSignal,
): Promise<void> {
  for await (const message of responses) {
    if (signal.aborted) return;
    if (!call.write(message)) await drained(call, signal);
  }
}

function drained(call: NodeJS.EventEmitter, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      call.removeListener('drain', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    call.once('drain', done);
    signal.addEventListener('abort', done, { once: true });
  });
}
