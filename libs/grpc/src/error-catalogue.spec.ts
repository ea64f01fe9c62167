import { Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { ERROR_CATALOGUE, type ErrorReason, reasonFactoryName } from './error-catalogue';
import { Errors, RpcError, httpStatusOfCode, toRpcError } from './rpc-error';

const reasons = Object.keys(ERROR_CATALOGUE) as ErrorReason[];

/** What a client of the service receives: the status the error is sent as. */
function received(error: RpcError): RpcError {
  const sent = error.toStatus();
  const failure: ServiceError = Object.assign(new Error(sent.details), {
    code: sent.code!,
    details: sent.details!,
    metadata: sent.metadata ?? new Metadata(),
  });
  return RpcError.fromServiceError(failure);
}

describe('the error catalogue', () => {
  it('has one factory per reason, named after it, making an error with the reason and its code', () => {
    expect(reasonFactoryName('MODEL_NOT_FOUND')).toBe('modelNotFound');
    expect(reasonFactoryName('INTERNAL')).toBe('internal');
    expect(Object.keys(Errors).sort()).toEqual(reasons.map(reasonFactoryName).sort());
    for (const reason of reasons) {
      const error = (Errors as unknown as Record<string, (message: string) => RpcError>)[reasonFactoryName(reason)]!(
        `a ${reason} error`,
      );
      expect([error.reason, error.code, error.message]).toEqual([
        reason,
        ERROR_CATALOGUE[reason].code,
        `a ${reason} error`,
      ]);
    }
  });

  it('gives every reason an HTTP status that agrees with its gRPC code, or a more precise one', () => {
    const precise: Partial<Record<ErrorReason, number>> = {
      PAYLOAD_TOO_LARGE: 413,
      UNSUPPORTED_MEDIA_TYPE: 415,
      BODY_TIMEOUT: 408,
      METHOD_NOT_ALLOWED: 405,
    };
    for (const reason of reasons) {
      const { code, http } = ERROR_CATALOGUE[reason];
      expect([reason, http]).toEqual([reason, precise[reason] ?? httpStatusOfCode(code)]);
    }
  });

  it('carries the reason, metadata and retry delay to the receiver, which keeps them through further hops', () => {
    const sent = Errors.queueFull('the queue of model "m" is full', {
      metadata: { model: 'm' },
      retryDelayMs: 1_500,
    });
    const once = received(sent);
    const twice = received(once);
    for (const error of [once, twice]) {
      expect(error.code).toBe(status.RESOURCE_EXHAUSTED);
      expect(error.reason).toBe('QUEUE_FULL');
      expect(error.metadata).toEqual({ model: 'm' });
      expect(error.retryDelayMs).toBe(1_500);
      expect(error.httpStatus).toBe(429);
    }
  });

  it('passes on a reason this build does not know unchanged, as UNRECOGNIZED with the code it came with', () => {
    const fromNewerPeer = new RpcError(status.FAILED_PRECONDITION, 'a newer failure', { reason: 'SOMETHING_NEW' });
    expect(fromNewerPeer.reason).toBe('UNRECOGNIZED');
    expect(fromNewerPeer.httpStatus).toBe(409);
    const relayed = received(fromNewerPeer);
    expect([relayed.code, relayed.reason]).toEqual([status.FAILED_PRECONDITION, 'UNRECOGNIZED']);
    const details = relayed.toStatus().metadata!.get('grpc-status-details-bin')[0] as Buffer;
    expect(details.toString('latin1')).toContain('SOMETHING_NEW');
  });

  it('leaves a failure without ErrorInfo (a transport failure) without a reason, its HTTP status from its code', () => {
    const transport = received(new RpcError(status.UNAVAILABLE, 'connection refused'));
    expect(transport.reason).toBeUndefined();
    expect(transport.httpStatus).toBe(503);
  });

  it('answers anything thrown that is not an RpcError as INTERNAL, without its message', () => {
    const error = toRpcError(new TypeError('secret detail'));
    expect([error.code, error.reason, error.message]).toEqual([status.INTERNAL, 'INTERNAL', 'internal error']);
  });
});
