import { status } from '@grpc/grpc-js';

/** What a reason means on the wire: its canonical gRPC code and its HTTP status on the REST API. */
export interface ErrorKind {
  readonly code: status;
  readonly http: number;
}

/**
 * Every reason an infermesh service puts in google.rpc.ErrorInfo, with its gRPC code and HTTP status:
 * the one place where a reason and its codes are paired. Errors are made with the factory of their
 * reason (`Errors.modelNotFound(message)`), never by choosing a code by hand. HTTP statuses follow the
 * Open Inference Protocol's REST mapping; a state that forbids a change is a conflict (409).
 */
export const ERROR_CATALOGUE = {
  // Callers and their requests.
  UNAUTHENTICATED: { code: status.UNAUTHENTICATED, http: 401 },
  PERMISSION_DENIED: { code: status.PERMISSION_DENIED, http: 403 },
  RATE_LIMITED: { code: status.RESOURCE_EXHAUSTED, http: 429 },
  INVALID_REQUEST: { code: status.INVALID_ARGUMENT, http: 400 },
  INVALID_TENSOR: { code: status.INVALID_ARGUMENT, http: 400 },
  INVALID_PRIORITY: { code: status.INVALID_ARGUMENT, http: 400 },
  INVALID_INSTANCE: { code: status.INVALID_ARGUMENT, http: 400 },
  MALFORMED_MESSAGE: { code: status.INVALID_ARGUMENT, http: 400 },
  // A body over a size limit: the same request never passes, so not RESOURCE_EXHAUSTED (which clients
  // retry); the gateway's GATEWAY_MAX_BODY_BYTES, and an artifact over the registry's limit on REST.
  PAYLOAD_TOO_LARGE: { code: status.INVALID_ARGUMENT, http: 413 },
  // A body in a content type or encoding the route does not take (a compressed body, say).
  UNSUPPORTED_MEDIA_TYPE: { code: status.INVALID_ARGUMENT, http: 415 },
  // A REST body that had not arrived whole within the gateway's receive timeout of its headers.
  BODY_TIMEOUT: { code: status.DEADLINE_EXCEEDED, http: 408 },
  // REST routing: a path nobody serves, and a known path asked with another method (with `allow`).
  ROUTE_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  METHOD_NOT_ALLOWED: { code: status.UNIMPLEMENTED, http: 405 },
  DATATYPE_UNSUPPORTED: { code: status.UNIMPLEMENTED, http: 501 },
  NOT_IMPLEMENTED: { code: status.UNIMPLEMENTED, http: 501 },
  CANCELLED: { code: status.CANCELLED, http: 499 },

  // Models, versions and artifacts.
  MODEL_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  VERSION_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  ARTIFACT_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  API_KEY_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  ALREADY_EXISTS: { code: status.ALREADY_EXISTS, http: 409 },
  INVALID_ARTIFACT: { code: status.INVALID_ARGUMENT, http: 400 },
  MODEL_NOT_READY: { code: status.UNAVAILABLE, http: 503 },
  VERSION_NOT_READY: { code: status.FAILED_PRECONDITION, http: 409 },
  VERSION_IN_USE: { code: status.FAILED_PRECONDITION, http: 409 },
  MODEL_IN_USE: { code: status.FAILED_PRECONDITION, http: 409 },
  MODEL_NOT_PLACED: { code: status.FAILED_PRECONDITION, http: 409 },

  // Rollouts and derived versions.
  NO_STABLE_VERSION: { code: status.FAILED_PRECONDITION, http: 409 },
  ROLLOUT_IN_PROGRESS: { code: status.FAILED_PRECONDITION, http: 409 },
  NO_ROLLOUT_IN_PROGRESS: { code: status.FAILED_PRECONDITION, http: 409 },
  NO_PAUSED_ROLLOUT: { code: status.FAILED_PRECONDITION, http: 409 },
  CANARY_REPLACED: { code: status.FAILED_PRECONDITION, http: 409 },
  ACCURACY_GATE: { code: status.FAILED_PRECONDITION, http: 409 },
  NOT_QUANTIZABLE: { code: status.FAILED_PRECONDITION, http: 409 },

  // Capacity and time.
  QUEUE_FULL: { code: status.RESOURCE_EXHAUSTED, http: 429 },
  OVERLOADED: { code: status.RESOURCE_EXHAUSTED, http: 429 },
  MEMORY_BUDGET_EXCEEDED: { code: status.RESOURCE_EXHAUSTED, http: 429 },
  DEADLINE_EXCEEDED: { code: status.DEADLINE_EXCEEDED, http: 504 },
  DEADLINE_INFEASIBLE: { code: status.DEADLINE_EXCEEDED, http: 504 },

  // Services and their upstreams.
  SERVICE_NOT_FOUND: { code: status.NOT_FOUND, http: 404 },
  UPSTREAM_UNAVAILABLE: { code: status.UNAVAILABLE, http: 503 },
  CIRCUIT_OPEN: { code: status.UNAVAILABLE, http: 503 },
  SHUTTING_DOWN: { code: status.UNAVAILABLE, http: 503 },
  WORKER_DRAINING: { code: status.UNAVAILABLE, http: 503 },
  EXECUTION_FAILED: { code: status.UNAVAILABLE, http: 503 },
  BATCH_SPLIT_MISMATCH: { code: status.INTERNAL, http: 500 },
  INTERNAL: { code: status.INTERNAL, http: 500 },

  // A reason received from another service that this build does not know (a newer peer, say); the
  // error keeps the code it was received with and passes the reason on unchanged.
  UNRECOGNIZED: { code: status.UNKNOWN, http: 500 },
} as const satisfies Record<string, ErrorKind>;

/** A machine-readable reason carried in google.rpc.ErrorInfo. */
export type ErrorReason = keyof typeof ERROR_CATALOGUE;

export function isErrorReason(value: string): value is ErrorReason {
  return Object.hasOwn(ERROR_CATALOGUE, value);
}

/** `MODEL_NOT_FOUND` → `modelNotFound`: the name of a reason's factory. */
export type ReasonFactoryName<R extends string> = R extends `${infer Head}_${infer Tail}`
  ? `${Lowercase<Head>}${CamelTail<Tail>}`
  : Lowercase<R>;
type CamelTail<R extends string> = R extends `${infer Head}_${infer Tail}`
  ? `${Capitalize<Lowercase<Head>>}${CamelTail<Tail>}`
  : Capitalize<Lowercase<R>>;

export function reasonFactoryName<R extends ErrorReason>(reason: R): ReasonFactoryName<R> {
  const [head = '', ...rest] = reason.toLowerCase().split('_');
  return (head + rest.map((part) => part.charAt(0).toUpperCase() + part.slice(1)).join('')) as ReasonFactoryName<R>;
}
