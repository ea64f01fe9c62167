import { Metadata, type ServiceError, status } from '@grpc/grpc-js';
// The exceptions Nest itself throws, which the filter answers as catalogue errors.
// eslint-disable-next-line no-restricted-imports
import { BadRequestException, HttpException, NotFoundException } from '@nestjs/common';
import { Errors, RpcError } from '@infermesh/grpc';
import { JsonLogger } from '@infermesh/telemetry';
import { HttpErrorFilter } from './http-error.filter';

/** An error received from an upstream outside infermesh: a code and a message, no ErrorInfo. */
function received(code: status, message: string): RpcError {
  const error: ServiceError = Object.assign(new Error(message), { code, details: message, metadata: new Metadata() });
  return RpcError.fromServiceError(error);
}

describe(HttpErrorFilter.name, () => {
  const logged: string[] = [];
  const sut = new HttpErrorFilter(new JsonLogger('test', 'error', (line) => logged.push(line)));
  const req = { method: 'POST', path: '/v2/models/m/infer' };

  it.each([
    ['INVALID_TENSOR', 400, Errors.invalidTensor],
    ['MALFORMED_MESSAGE', 400, Errors.malformedMessage],
    ['UNAUTHENTICATED', 401, Errors.unauthenticated],
    ['PERMISSION_DENIED', 403, Errors.permissionDenied],
    ['MODEL_NOT_FOUND', 404, Errors.modelNotFound],
    ['VERSION_IN_USE', 409, Errors.versionInUse],
    ['ALREADY_EXISTS', 409, Errors.alreadyExists],
    ['PAYLOAD_TOO_LARGE', 413, Errors.payloadTooLarge],
    ['UNSUPPORTED_MEDIA_TYPE', 415, Errors.unsupportedMediaType],
    ['RATE_LIMITED', 429, Errors.rateLimited],
    ['CANCELLED', 499, Errors.cancelled],
    ['DATATYPE_UNSUPPORTED', 501, Errors.datatypeUnsupported],
    ['MODEL_NOT_READY', 503, Errors.modelNotReady],
    ['DEADLINE_EXCEEDED', 504, Errors.deadlineExceeded],
    ['INTERNAL', 500, Errors.internal],
  ])(
    'answers a %s error with its catalogue status, HTTP %i, and {"error": message}',
    (_reason, httpStatus, factory) => {
      expect(sut.reply(factory('what went wrong'), req)).toMatchObject({
        status: httpStatus,
        body: { error: 'what went wrong' },
      });
    },
  );

  it.each([
    [status.INVALID_ARGUMENT, 400],
    [status.FAILED_PRECONDITION, 409],
    [status.UNAUTHENTICATED, 401],
    [status.PERMISSION_DENIED, 403],
    [status.NOT_FOUND, 404],
    [status.ALREADY_EXISTS, 409],
    [status.RESOURCE_EXHAUSTED, 429],
    [status.UNIMPLEMENTED, 501],
    [status.UNAVAILABLE, 503],
    [status.DEADLINE_EXCEEDED, 504],
    [status.INTERNAL, 500],
  ])('answers gRPC code %i received without a reason with HTTP %i', (code, httpStatus) => {
    expect(sut.reply(received(code, 'what went wrong'), req)).toMatchObject({
      status: httpStatus,
      body: { error: 'what went wrong' },
    });
  });

  it('bounds the message of any error, whatever text it quotes', () => {
    const huge = 'n'.repeat(100_000);
    for (const exception of [
      Errors.modelNotFound(`model "${huge}" is not registered`),
      new BadRequestException(`bad "${huge}"`),
    ]) {
      const { body } = sut.reply(exception, req);
      expect(body.error.length).toBeLessThan(1_100);
      expect(body.error).toMatch(/…\(\d+ bytes\)$/);
    }
  });

  it('sets Retry-After in whole seconds when the error says when to retry', () => {
    const reply = sut.reply(Errors.overloaded('full', { retryDelayMs: 250 }), req);
    expect(reply.headers).toEqual({ 'retry-after': '1' });
    expect(sut.reply(Errors.queueFull('full', { retryDelayMs: 2001 }), req).headers).toEqual({
      'retry-after': '3',
    });
    // A 503 from an open circuit says when the next attempt goes through.
    expect(sut.reply(Errors.circuitOpen('circuit open', { retryDelayMs: 4200 }), req).headers).toEqual({
      'retry-after': '5',
    });
    expect(sut.reply(Errors.overloaded('full'), req).headers).toEqual({});
  });

  it('asks for a bearer token on 401', () => {
    expect(sut.reply(Errors.unauthenticated('no key'), req).headers).toEqual({
      'www-authenticate': 'Bearer',
    });
  });

  it("answers Nest's own HTTP exceptions as the catalogue errors of their status", () => {
    expect(sut.reply(new BadRequestException('bad path parameter'), req)).toEqual({
      status: 400,
      body: { error: 'bad path parameter' },
      headers: {},
    });
    expect(sut.reply(new HttpException('too big', 413), req)).toMatchObject({
      status: 413,
      body: { error: 'too big' },
    });
    // A status no catalogue error has is not one Nest throws for the gateway: a bug, answered 500.
    logged.length = 0;
    expect(sut.reply(new HttpException("I'm a teapot", 418), req)).toMatchObject({ status: 500 });
    expect(logged.join('')).toContain('teapot');
  });

  it('answers 405 with Allow for a known path with the wrong method, 404 for an unknown path', () => {
    expect(
      sut.reply(new NotFoundException('Cannot GET /v2/models/m/infer'), { method: 'GET', path: '/v2/models/m/infer' }),
    ).toEqual({
      status: 405,
      body: { error: 'GET is not allowed on /v2/models/m/infer; use POST' },
      headers: { allow: 'POST' },
    });
    expect(
      sut.reply(new NotFoundException('Cannot PUT /v2/models/m'), { method: 'PUT', path: '/v2/models/m/versions/2' }),
    ).toMatchObject({
      status: 405,
      headers: { allow: 'GET, HEAD' },
    });
    expect(sut.reply(new NotFoundException('Cannot GET /v1'), { method: 'GET', path: '/v1' })).toEqual({
      status: 404,
      body: { error: 'Cannot GET /v1' },
      headers: {},
    });
  });

  it('answers an unexpected error 500 without its details, and logs it', () => {
    logged.length = 0;
    const reply = sut.reply(new TypeError('secret internals'), req);
    expect(reply).toEqual({ status: 500, body: { error: 'internal error' }, headers: {} });
    expect(logged.join('')).toContain('secret internals');
  });
});
