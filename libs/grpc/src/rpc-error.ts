import { anyPack, anyUnpack } from '@bufbuild/protobuf/wkt';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { ErrorInfoSchema, RetryInfoSchema } from '@infermesh/proto/gen/google/rpc/error_details_pb';
import { StatusSchema } from '@infermesh/proto/gen/google/rpc/status_pb';
import { boundedText } from '@infermesh/tensors';

export const ERROR_DOMAIN = 'infermesh.io';
/** The most characters of an error message, as sent in `grpc-message` (and twice more in the details) and REST error bodies. */
export const MAX_ERROR_MESSAGE_CHARS = 1_024;
/** The most entries of an error's ErrorInfo metadata, and the most characters of each key and value. */
export const MAX_ERROR_METADATA_ENTRIES = 16;
export const MAX_ERROR_METADATA_CHARS = 256;
const DETAILS_KEY = 'grpc-status-details-bin';

/** Machine-readable reasons carried in google.rpc.ErrorInfo. */
export type ErrorReason =
  | 'UNAUTHENTICATED'
  | 'MODEL_NOT_FOUND'
  | 'VERSION_NOT_FOUND'
  | 'MODEL_NOT_READY'
  | 'INVALID_TENSOR'
  | 'DATATYPE_UNSUPPORTED'
  | 'INVALID_REQUEST'
  | 'INVALID_ARTIFACT'
  | 'ARTIFACT_NOT_FOUND'
  | 'ALREADY_EXISTS'
  | 'QUEUE_FULL'
  | 'OVERLOADED'
  | 'CIRCUIT_OPEN'
  | 'DEADLINE_EXCEEDED'
  | 'UPSTREAM_UNAVAILABLE'
  | 'SHUTTING_DOWN'
  | 'MALFORMED_MESSAGE'
  | 'PERMISSION_DENIED'
  | 'VERSION_IN_USE'
  | 'MODEL_IN_USE'
  | 'MODEL_NOT_PLACED'
  | 'RATE_LIMITED'
  | 'ACCURACY_GATE'
  | 'NOT_QUANTIZABLE'
  | 'INTERNAL';

export interface RpcErrorOptions {
  /** An ErrorReason, or a reason received from another service. */
  reason?: string;
  metadata?: Record<string, string>;
  retryDelayMs?: number;
}

/**
 * An error with a canonical gRPC code and google.rpc.ErrorInfo details. Thrown by handlers, sent as
 * the call's status; received by clients, rebuilt from the status. It passes unchanged through hops.
 * Its message and metadata are bounded in size (MAX_ERROR_MESSAGE_CHARS, boundedMetadata), however
 * they were built: a status that echoes a client's text can never outgrow the HTTP/2 header limits
 * of a connection that other calls share (a trailer too large tears the whole connection down).
 */
export class RpcError extends Error {
  readonly reason: string | undefined;
  readonly metadata: Record<string, string>;
  readonly retryDelayMs: number | undefined;

  constructor(
    readonly code: status,
    message: string,
    options: RpcErrorOptions = {},
  ) {
    super(boundedText(message, MAX_ERROR_MESSAGE_CHARS));
    this.name = 'RpcError';
    this.reason = options.reason === undefined ? undefined : boundedText(options.reason, 64);
    this.metadata = boundedMetadata(options.metadata ?? {});
    this.retryDelayMs = options.retryDelayMs;
  }

  static invalidArgument(message: string, reason: ErrorReason = 'INVALID_REQUEST', metadata?: Record<string, string>) {
    return new RpcError(status.INVALID_ARGUMENT, message, { reason, ...(metadata && { metadata }) });
  }
  static notFound(message: string, reason: ErrorReason, metadata?: Record<string, string>) {
    return new RpcError(status.NOT_FOUND, message, { reason, ...(metadata && { metadata }) });
  }
  static unavailable(message: string, reason: ErrorReason = 'UPSTREAM_UNAVAILABLE') {
    return new RpcError(status.UNAVAILABLE, message, { reason });
  }

  /** The grpc-js status object for a call's callback or emit. */
  toStatus(): Partial<ServiceError> {
    const details = [];
    if (this.reason !== undefined) {
      details.push(
        anyPack(
          ErrorInfoSchema,
          create(ErrorInfoSchema, { reason: this.reason, domain: ERROR_DOMAIN, metadata: this.metadata }),
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
    const trailer = new Metadata();
    if (details.length > 0) {
      const body = toBinary(StatusSchema, create(StatusSchema, { code: this.code, message: this.message, details }));
      trailer.set(DETAILS_KEY, Buffer.from(body.buffer, body.byteOffset, body.byteLength));
    }
    return { code: this.code, details: this.message, metadata: trailer };
  }

  /** Rebuilds an RpcError from a failed call, reading ErrorInfo and RetryInfo when present. */
  static fromServiceError(error: ServiceError): RpcError {
    const options: RpcErrorOptions = {};
    const raw = error.metadata?.get(DETAILS_KEY)[0];
    if (raw instanceof Buffer) {
      try {
        const st = fromBinary(StatusSchema, raw);
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
    }
    return new RpcError(error.code, error.details || error.message, options);
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
  return new RpcError(status.INTERNAL, 'internal error', { reason: 'INTERNAL' });
}
