import { status } from '@grpc/grpc-js';

/**
 * The HTTP status of a canonical gRPC code, per the Open Inference Protocol's REST mapping; a failed
 * precondition (a state that forbids the change, e.g. retiring a version that serves) is a conflict.
 */
export function httpStatusOf(code: status): number {
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
    case status.UNKNOWN:
    case status.INTERNAL:
    case status.DATA_LOSS:
      return 500;
    default:
      return 500;
  }
}
