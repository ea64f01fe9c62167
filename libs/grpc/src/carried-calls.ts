import {
  create,
  type DescField,
  type DescMessage,
  type DescMethod,
  type DescService,
  ScalarType,
} from '@bufbuild/protobuf';
import { type ClientDuplexStream, type ServiceError, status } from '@grpc/grpc-js';
import type { Status } from '@infermesh/proto/gen/google/rpc/status_pb';
import { StatusSchema } from '@infermesh/proto/gen/google/rpc/status_pb';
import { type RequestContext, requestContext, spans } from '@infermesh/telemetry';
import { delayUntil } from './deadline';
import { encodedSize } from './message-encoding';
import type { CallOptions } from './method-types';
import { Errors, RpcError } from './rpc-error';

/**
 * Carried calls: a unary method served over one long-lived bidirectional stream, each message one
 * call. On grpc-js a unary call costs a stream of its own (headers, trailers, metadata, grpc-js's
 * call stack on both sides); a message on an open stream costs a fraction of that (on this project's
 * 2-core machine, a 120 B request answered with 2 KiB: about 480 µs of CPU, client and server
 * together, as a call at concurrency 1 and 130 µs at 16; about 140 and 16 µs carried, `npm run bench
 * -- carried`). The
 * server serves each carried call as it serves the unary one (its handler, span, duration metric
 * under the unary method's name, errors); the client offers the unary method's signature.
 *
 * The stream method `S` carrying unary method `U` follows one convention, checked when either side
 * is built (checkCarrier): S's request has `repeated Call calls`, each Call with `uint32 id`,
 * `U.input request`, `string traceparent`, `string tracestate`, `uint32 timeout_ms` and `string
 * request_id` (what the call's metadata would have said); its response has `repeated Result
 * results`, each with `uint32 id`, `U.output response` and `google.rpc.Status status` (set when the
 * call failed). Answers come in the order calls end, by id. S's request may also have `repeated uint32
 * cancelled`: the ids of calls the client gave up on (their signal aborted), each then cancelled on
 * the server as a unary call is (its handler's signal aborted) and not answered. Without it, a call
 * given up is only forgotten by the client: for calls that end soon anyway, as lookups.
 *
 * Each side sends together, as one message, what it has to send in one turn of its event loop
 * (CarriedOutbox). grpc-js writes a stream's messages one at a time, each once the one before it
 * left the socket: one message per call cost a write, and a wake-up of the other side, per call,
 * where unary calls made together share them.
 *
 * What is lost against unary calls: per-call load balancing and retries by the mesh (a stream goes
 * to one server, renewed every CARRIER_RENEW_MS so that calls follow the mesh's balancing), and
 * metadata other than the request id. For calls that may fail harmlessly, as a cache lookup may.
 */

/** How long a stream carries new calls; then new calls open another, and this one ends once answered. */
export const CARRIER_RENEW_MS = 30_000;

/** A carried call's request, as an element of the stream method's request message has it. */
export interface CarriedCall {
  id: number;
  request: unknown;
  traceparent: string;
  tracestate: string;
  timeoutMs: number;
  requestId: string;
}

/** A carried call's answer, as an element of the stream method's response message has it. */
export interface CarriedResult {
  id: number;
  response?: unknown;
  status?: Status;
}

/** A message of a carrying stream from the client: the calls made in one turn of its event loop. */
export interface CarriedRequest {
  calls: CarriedCall[];
  /** Calls given up by the client, by id (when the stream method's request has the field). */
  cancelled?: number[];
}

/** A message of a carrying stream from the server: the answers of calls that ended in one turn. */
export interface CarriedResponse {
  results: CarriedResult[];
}

/** A message sent together carries at most about this many bytes of calls or answers; a larger one goes alone. */
export const CARRIED_MESSAGE_BYTES = 1024 * 1024;

/**
 * A call whose request is larger than this goes as a call of its own, not carried: written on the
 * stream, it would hold every call behind it while it is written (a call of its own shares the
 * connection frame by frame), and what a call costs more than a message is small against its bytes.
 */
export const CARRIED_CALL_MAX_BYTES = 256 * 1024;

/**
 * What a message sent together may carry on a channel whose messages are at most `maxMessageBytes`:
 * CARRIED_MESSAGE_BYTES, or half that limit when it is smaller, so that calls that fit one by one
 * (a batcher keeps its batches 64 KiB within it) never make, together, a message the limit refuses.
 */
export function carriedMessageBytes(maxMessageBytes: number): number {
  return Math.min(CARRIED_MESSAGE_BYTES, Math.floor(maxMessageBytes / 2));
}

/**
 * What one side of a carrying stream sends: items queued in one turn of the event loop go together,
 * as one message, at the end of that turn (setImmediate), or before it once they hold `maxBytes`
 * (carriedMessageBytes). Each item comes with its size in bytes (its encoding's, about). `send`
 * drops what its stream can no longer carry.
 */
export class CarriedOutbox<T> {
  private items: T[] = [];
  private bytes = 0;
  private scheduled = false;

  constructor(
    private readonly send: (items: T[]) => void,
    private readonly maxBytes = CARRIED_MESSAGE_BYTES,
  ) {}

  /** Queues `item`, of `size` bytes. */
  push(item: T, size: number): void {
    if (this.items.length > 0 && this.bytes + size > this.maxBytes) this.flush();
    this.items.push(item);
    this.bytes += size;
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => {
        this.scheduled = false;
        this.flush();
      });
    }
  }

  /** Sends what waits, now. */
  flush(): void {
    if (this.items.length === 0) return;
    const items = this.items;
    this.items = [];
    this.bytes = 0;
    this.send(items);
  }
}

/**
 * The methods of `service` named `streamName` and `unaryName` (local names), once checked that the
 * first can carry the second (checkCarrier): what GrpcServer.add and createClient build on.
 */
export function carrierMethods(
  service: DescService,
  streamName: string,
  unaryName: string,
): { stream: DescMethod; unary: DescMethod } {
  const find = (name: string) => {
    const method = service.methods.find((m) => m.localName === name);
    if (method === undefined) throw new Error(`${service.typeName} has no method ${name} to carry calls or be carried`);
    return method;
  };
  const stream = find(streamName);
  const unary = find(unaryName);
  checkCarrier(stream, unary);
  return { stream, unary };
}

/** Throws unless `stream` can carry `unary` (the convention above), naming what is missing. */
export function checkCarrier(stream: DescMethod, unary: DescMethod): void {
  const problems: string[] = [];
  if (stream.methodKind !== 'bidi_streaming') problems.push(`${stream.name} is not bidirectional`);
  if (unary.methodKind !== 'unary') problems.push(`${unary.name} is not unary`);
  /** The message of a repeated message field, noting its absence. */
  const elementOf = (message: DescMessage, name: string): DescMessage | undefined => {
    const field = message.fields.find((f) => f.localName === name);
    if (field?.fieldKind === 'list' && field.listKind === 'message') return field.message;
    problems.push(`${message.typeName} needs repeated ${name}`);
    return undefined;
  };
  const expect = (message: DescMessage, name: string, fits: (field: DescField) => boolean, what: string) => {
    const field = message.fields.find((f) => f.localName === name);
    if (field === undefined || !fits(field)) problems.push(`${message.typeName} needs ${what}`);
  };
  const scalar = (type: ScalarType) => (f: DescField) => f.fieldKind === 'scalar' && f.scalar === type;
  const message = (typeName: string) => (f: DescField) => f.fieldKind === 'message' && f.message.typeName === typeName;
  const call = elementOf(stream.input, 'calls');
  if (call !== undefined) {
    expect(call, 'id', scalar(ScalarType.UINT32), 'uint32 id');
    expect(call, 'request', message(unary.input.typeName), `${unary.input.typeName} request`);
    expect(call, 'traceparent', scalar(ScalarType.STRING), 'string traceparent');
    expect(call, 'tracestate', scalar(ScalarType.STRING), 'string tracestate');
    expect(call, 'timeoutMs', scalar(ScalarType.UINT32), 'uint32 timeout_ms');
    expect(call, 'requestId', scalar(ScalarType.STRING), 'string request_id');
  }
  const cancelled = stream.input.fields.find((f) => f.localName === 'cancelled');
  if (cancelled !== undefined && !(cancelled.fieldKind === 'list' && cancelled.scalar === ScalarType.UINT32)) {
    problems.push(`${stream.input.typeName} needs cancelled to be repeated uint32`);
  }
  const result = elementOf(stream.output, 'results');
  if (result !== undefined) {
    expect(result, 'id', scalar(ScalarType.UINT32), 'uint32 id');
    expect(result, 'response', message(unary.output.typeName), `${unary.output.typeName} response`);
    expect(result, 'status', message(StatusSchema.typeName), `${StatusSchema.typeName} status`);
  }
  if (problems.length > 0) {
    throw new Error(`${stream.parent.typeName}.${stream.name} cannot carry ${unary.name}: ${problems.join('; ')}`);
  }
}

/** What the id of a call given up adds to a message, at most (a varint in a packed field). */
const CANCELLED_ID_BYTES = 5;

/** Whether the client of `stream` (checked by checkCarrier) can say which calls it gave up on. */
export function carriesCancellation(stream: DescMethod): boolean {
  return stream.input.fields.some((f) => f.localName === 'cancelled');
}

interface Pending {
  resolve: (response: unknown) => void;
  reject: (error: RpcError) => void;
  /** Stops the call's timer and its abort listener. */
  release: () => void;
}

/** One stream and the calls it carries. */
interface Carrier {
  call: ClientDuplexStream<CarriedRequest, CarriedResponse>;
  pending: Map<number, Pending>;
  /** Calls made and not yet sent, and the ids of calls given up (numbers). */
  outbox: CarriedOutbox<CarriedCall | number>;
  openedAt: number;
  ended: boolean;
  /** Renewed: the client sends nothing more on it (half-closed), it ends once answered. */
  renewed: boolean;
}

/**
 * The client side: calls of one unary method carried on a stream opened by `open`. A stream that
 * fails or ends fails the calls it still carries (with its status, else UNAVAILABLE); the next call
 * opens another.
 */
export class CarriedCalls {
  private carrier: Carrier | undefined;
  private nextId = 0;
  private closed = false;

  constructor(
    private readonly method: DescMethod,
    private readonly open: () => ClientDuplexStream<CarriedRequest, CarriedResponse>,
    private readonly deadlineOf: (
      options: CallOptions | undefined,
      ambient: RequestContext | undefined,
    ) => number | undefined,
    private readonly renewMs = CARRIER_RENEW_MS,
    /** What a message carries together at most (carriedMessageBytes of the channel's limit). */
    private readonly messageBytes = CARRIED_MESSAGE_BYTES,
    /** Whether the server is told of calls given up (carriesCancellation of the stream method). */
    private readonly cancellable = false,
    /** Makes a call of its own, for requests over CARRIED_CALL_MAX_BYTES; unset: every call is carried. */
    private readonly alone?: (request: unknown, options?: CallOptions) => Promise<unknown>,
  ) {}

  async call(request: unknown, options?: CallOptions): Promise<unknown> {
    const extra = Object.keys(options?.metadata ?? {}).filter((key) => key !== 'x-request-id');
    if (extra.length > 0) {
      throw new Error(`${this.method.name} is carried on a stream: it cannot send metadata ${extra.join(', ')}`);
    }
    if (this.closed) throw Errors.upstreamUnavailable(`the client of ${this.method.name} is closed`);
    // A message, not its init shape: sized here, encoded as it is with the others.
    const message = create(this.method.input, request as never);
    let size: number;
    try {
      size = encodedSize(this.method.input, message);
    } catch (error) {
      throw Errors.internal(
        `the request of ${this.method.name} cannot be encoded: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    // A call of its own reads its deadline, signal and trace context itself.
    if (this.alone !== undefined && size > CARRIED_CALL_MAX_BYTES) return await this.alone(message, options);
    const ambient = requestContext.current();
    const deadline = this.deadlineOf(options, ambient);
    const signal = options?.signal ?? ambient?.signal;
    if (signal?.aborted === true) throw Errors.cancelled(`${this.method.name} was cancelled`);
    const trace = ambient?.span === undefined ? undefined : spans.propagate(ambient.span);
    const carrier = this.current();
    const id = (this.nextId = (this.nextId + 1) >>> 0);
    return await new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const giveUp = (error: RpcError) => {
        carrier.pending.delete(id);
        release();
        reject(error);
      };
      const onAbort = () => {
        giveUp(Errors.cancelled(`${this.method.name} was cancelled`));
        // Sent with the calls of this turn: a call made and given up in one turn is sent, then cancelled.
        if (this.cancellable && !carrier.ended && !carrier.renewed) carrier.outbox.push(id, CANCELLED_ID_BYTES);
      };
      const release = () => {
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (deadline !== undefined) {
        timer = setTimeout(
          () => giveUp(Errors.deadlineExceeded(`${this.method.name} was not answered within its deadline`)),
          delayUntil(deadline),
        );
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      carrier.pending.set(id, { resolve, reject, release });
      carrier.outbox.push(
        {
          id,
          request: message,
          traceparent: trace?.traceparent ?? '',
          tracestate: trace?.tracestate ?? '',
          timeoutMs: deadline === undefined ? 0 : Math.max(1, Math.min(deadline - Date.now(), 0xffffffff)),
          requestId: options?.metadata?.['x-request-id'] ?? ambient?.requestId ?? '',
        },
        size,
      );
    });
  }

  /** Ends the stream; the calls it still carries fail with CANCELLED. */
  close(): void {
    this.closed = true;
    const carrier = this.carrier;
    this.carrier = undefined;
    if (carrier !== undefined) {
      this.end(carrier, Errors.cancelled(`the client of ${this.method.name} was closed`));
      carrier.call.cancel();
    }
  }

  /** The stream new calls go on: the open one, unless it is due for renewal. */
  private current(): Carrier {
    const now = performance.now();
    const open = this.carrier;
    if (open !== undefined && !open.ended && now - open.openedAt < this.renewMs) return open;
    if (open !== undefined && !open.ended) {
      open.outbox.flush();
      open.renewed = true;
      open.call.end(); // answered, then ended by the server
    }
    const call = this.open();
    const outbox = new CarriedOutbox<CarriedCall | number>((items) => {
      if (carrier.ended) return;
      const calls: CarriedCall[] = [];
      const cancelled: number[] = [];
      for (const item of items) {
        if (typeof item === 'number') cancelled.push(item);
        else calls.push(item);
      }
      call.write(cancelled.length === 0 ? { calls } : { calls, cancelled });
    }, this.messageBytes);
    const carrier: Carrier = { call, pending: new Map(), outbox, openedAt: now, ended: false, renewed: false };
    call.on('data', ({ results }: CarriedResponse) => {
      for (const result of results) {
        const pending = carrier.pending.get(result.id);
        if (pending === undefined) continue; // given up already (deadline, cancellation)
        carrier.pending.delete(result.id);
        pending.release();
        if (result.status !== undefined && result.status.code !== 0)
          pending.reject(RpcError.fromRpcStatus(result.status));
        else pending.resolve(result.response);
      }
    });
    call.on('error', (error: ServiceError) => {
      const failure = RpcError.fromServiceError(error);
      // A stream the server cut (its reset reads as CANCELLED here) is the server gone, not the call
      // given up: a transport failure (UNAVAILABLE, no reason), as a unary call to a server that is
      // not there fails (the batcher then marks that worker unreachable).
      this.end(
        carrier,
        failure.code === status.CANCELLED && !this.closed
          ? RpcError.transportFailure(`the stream carrying ${this.method.name} was cut: ${failure.message}`)
          : failure,
      );
    });
    call.on('end', () => {
      this.end(
        carrier,
        RpcError.transportFailure(`the stream carrying ${this.method.name} ended before answering; call again`),
      );
      call.end();
    });
    this.carrier = carrier;
    return carrier;
  }

  /** Fails what a stream that ended still carries; new calls go on another. */
  private end(carrier: Carrier, error: RpcError): void {
    carrier.ended = true;
    if (this.carrier === carrier) this.carrier = undefined;
    const pending = [...carrier.pending.values()];
    carrier.pending.clear();
    for (const call of pending) {
      call.release();
      call.reject(error);
    }
  }
}
