import { anyPack, anyUnpack } from '@bufbuild/protobuf/wkt';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { ErrorInfoSchema, RetryInfoSchema } from '@infermesh/proto/gen/google/rpc/error_details_pb';
import { type Status, StatusSchema } from '@infermesh/proto/gen/google/rpc/status_pb';
import { boundedText } from '@infermesh/tensors';
import {
  ERROR_CATALOGUE,
  type ErrorReason,
  isErrorReason,
  type ReasonFactoryName,
  reasonFactoryName,
} from './error-catalogue';

export const ERROR_DOMAIN = 'infermesh.io';
/** The most characters of an error message, as sent in `grpc-message` (and twice more in the details) and REST error bodies. */
export const MAX_ERROR_MESSAGE_CHARS = 1_024;
/** The most entries of an error's ErrorInfo metadata, and the most characters of each key and value. */
export const MAX_ERROR_METADATA_ENTRIES = 16;
export const MAX_ERROR_METADATA_CHARS = 256;
const DETAILS_KEY = 'grpc-status-details-bin';

export interface RpcErrorOptions {
  metadata?: Record<string, string>;
  retryDelayMs?: number;
}

interface ReceivedErrorOptions extends RpcErrorOptions {
  /** The reason as received, which may be one this build does not know. */
  reason?: string;
}

/**
 * An error with a canonical gRPC code and google.rpc.ErrorInfo details. Thrown by handlers, sent as
 * the call's status; received by clients, rebuilt from the status. It passes unchanged through hops.
 * Its message and metadata are bounded in size (MAX_ERROR_MESSAGE_CHARS, boundedMetadata), however
 * they were built: a status that echoes a client's text can never outgrow the HTTP/2 header limits
 * of a connection that other calls share (a trailer too large tears the whole connection down).
 */
export class RpcError extends Error {
  /** The error's reason; undefined for a failure without ErrorInfo (a transport failure, or a peer outside infermesh). */
  readonly reason: ErrorReason | undefined;
  readonly metadata: Record<string, string>;
  readonly retryDelayMs: number | undefined;
  /** The reason sent on: the received one unchanged when this build does not know it. */
  private readonly wireReason: string | undefined;

  /**
   * Errors are made with `Errors.<reason>(message)`, which takes the code from the catalogue; this
   * constructor is for rebuilding a received status (`fromServiceError`) and for a transport failure
   * (`transportFailure`), and is used nowhere else.
   */
  constructor(
    readonly code: status,
    message: string,
    options: ReceivedErrorOptions = {},
  ) {
    super(boundedText(message, MAX_ERROR_MESSAGE_CHARS));
    this.name = 'RpcError';
    this.wireReason = options.reason === undefined ? undefined : boundedText(options.reason, 64);
    this.reason =
      this.wireReason === undefined ? undefined : isErrorReason(this.wireReason) ? this.wireReason : 'UNRECOGNIZED';
    this.metadata = boundedMetadata(options.metadata ?? {});
    this.retryDelayMs = options.retryDelayMs;
  }

  /**
   * A failure of the transport, not an answer of the server: UNAVAILABLE without a reason, as grpc-js
   * reports a call that reached no server (`reason`). A carried call's stream that failed is one
   * (carried-calls.ts), so that callers tell the two apart alike, carried or not.
   */
  static transportFailure(message: string): RpcError {
    return new RpcError(status.UNAVAILABLE, message);
  }

  /** An error of a catalogue reason, with the reason's code. */
  static of(reason: ErrorReason, message: string, options: RpcErrorOptions = {}): RpcError {
    return new RpcError(ERROR_CATALOGUE[reason].code, message, { ...options, reason });
  }

  /** The REST status of this error: its reason's, or its code's when it has none. */
  get httpStatus(): number {
    return this.reason !== undefined && this.reason !== 'UNRECOGNIZED'
      ? ERROR_CATALOGUE[this.reason].http
      : httpStatusOfCode(this.code);
  }

  /** The grpc-js status object for a call's callback or emit. */
  toStatus(): Partial<ServiceError> {
    const trailer = new Metadata();
    const st = this.toRpcStatus();
    if (st.details.length > 0) {
      const body = toBinary(StatusSchema, st);
      trailer.set(DETAILS_KEY, Buffer.from(body.buffer, body.byteOffset, body.byteLength));
    }
    return { code: this.code, details: this.message, metadata: trailer };
  }

  /** This error as a google.rpc.Status: its code, its message, ErrorInfo and RetryInfo when it has them. */
  toRpcStatus(): Status {
    const details = [];
    if (this.wireReason !== undefined) {
      details.push(
        anyPack(
          ErrorInfoSchema,
          create(ErrorInfoSchema, { reason: this.wireReason, domain: ERROR_DOMAIN, metadata: this.metadata }),
        ),
      );
    }
    if (this.retryDelayMs !== undefined) {
      const ms = Math.max(0, Math.round(this.retryDelayMs));
      details.push(
        anyPack(
          RetryInfoSchema,
          create(RetryInfoSchema, { retryDelay: { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 } }),
        ),
      );
    }
    return create(StatusSchema, { code: this.code, message: this.message, details });
  }

  /** Rebuilds an RpcError from a failed call, reading ErrorInfo and RetryInfo when present. */
  static fromServiceError(error: ServiceError): RpcError {
    const raw = error.metadata?.get(DETAILS_KEY)[0];
    let details: Status | undefined;
    if (raw instanceof Buffer) {
      try {
        details = fromBinary(StatusSchema, raw);
      } catch {
        // Undecodable details: keep the code and the message.
      }
    }
    return RpcError.fromRpcStatus(details ?? create(StatusSchema), error.code, error.details || error.message);
  }

  /**
   * Rebuilds an RpcError from a google.rpc.Status (a carried call's, or a failed call's details),
   * reading ErrorInfo and RetryInfo when present; the code and message given override the status's.
   */
  static fromRpcStatus(st: Status, code: status = st.code, message: string = st.message): RpcError {
    const options: ReceivedErrorOptions = {};
    try {
      for (const detail of st.details) {
        const info = anyUnpack(detail, ErrorInfoSchema);
        if (info !== undefined) {
          options.reason = info.reason;
          options.metadata = { ...info.metadata };
        }
        const retry = anyUnpack(detail, RetryInfoSchema);
        if (retry?.retryDelay !== undefined) {
          options.retryDelayMs = Number(retry.retryDelay.seconds) * 1000 + retry.retryDelay.nanos / 1e6;
        }
      }
    } catch {
      // Undecodable details: keep the code and the message.
    }
    return new RpcError(code, message, options);
  }
}

/** ErrorInfo metadata within MAX_ERROR_METADATA_ENTRIES entries of MAX_ERROR_METADATA_CHARS characters each. */
function boundedMetadata(metadata: Readonly<Record<string, string>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(metadata).slice(0, MAX_ERROR_METADATA_ENTRIES)) {
    out[boundedText(key, MAX_ERROR_METADATA_CHARS)] = boundedText(value, MAX_ERROR_METADATA_CHARS);
  }
  return out;
}

export function isServiceError(error: unknown): error is ServiceError {
  return error instanceof Error && typeof (error as Partial<ServiceError>).code === 'number' && 'metadata' in error;
}

/** Any thrown value as an RpcError: RpcErrors and failed calls keep their code, the rest are INTERNAL. */
export function toRpcError(error: unknown): RpcError {
  if (error instanceof RpcError) return error;
  if (isServiceError(error)) return RpcError.fromServiceError(error);
  return Errors.internal('internal error');
}

/** One factory per catalogue reason: `Errors.queueFull(message, { retryDelayMs })`. */
export type ErrorFactories = {
  readonly [R in ErrorReason as ReasonFactoryName<R>]: (message: string, options?: RpcErrorOptions) => RpcError;
};

export const Errors = Object.fromEntries(
  (Object.keys(ERROR_CATALOGUE) as ErrorReason[]).map((reason) => [
    reasonFactoryName(reason),
    (message: string, options?: RpcErrorOptions) => RpcError.of(reason, message, options),
  ]),
) as ErrorFactories;

/**
 * The HTTP status of a canonical gRPC code, per the Open Inference Protocol's REST mapping, for an
 * error without a reason; one with a reason takes its catalogue entry's.
 */
export function httpStatusOfCode(code: status): number {
  switch (code) {
    case status.OK:
      return 200;
    case status.INVALID_ARGUMENT:
    case status.OUT_OF_RANGE:
      return 400;
    case status.UNAUTHENTICATED:
      return 401;
    case status.PERMISSION_DENIED:
      return 403;
    case status.NOT_FOUND:
      return 404;
    case status.ALREADY_EXISTS:
    case status.FAILED_PRECONDITION:
    case status.ABORTED:
      return 409;
    case status.RESOURCE_EXHAUSTED:
      return 429;
    case status.CANCELLED:
      return 499;
    case status.UNIMPLEMENTED:
      return 501;
    case status.UNAVAILABLE:
      return 503;
    case status.DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}
