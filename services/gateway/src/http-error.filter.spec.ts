import { status } from '@grpc/grpc-js';
import { BadRequestException, NotFoundException, PayloadTooLargeException } from '@nestjs/common';
import { RpcError } from '@infermesh/grpc';
import { JsonLogger } from '@infermesh/telemetry';
import { HttpErrorFilter } from './http-error.filter';

describe(HttpErrorFilter.name, () => {
  const logged: string[] = [];
  const sut = new HttpErrorFilter(new JsonLogger('test', 'error', (line) => logged.push(line)));
  const req = { method: 'POST', path: '/v2/models/m/infer' };

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
  ])('answers gRPC code %i with HTTP %i and {"error": message}', (code, httpStatus) => {
    expect(sut.reply(new RpcError(code, 'what went wrong'), req)).toMatchObject({
      status: httpStatus,
      body: { error: 'what went wrong' },
    });
  });

  it('bounds the message of any error, whatever text it quotes', () => {
    const huge = 'n'.repeat(100_000);
    for (const exception of [
      new RpcError(status.NOT_FOUND, `model "${huge}" is not registered`),
      new BadRequestException(`bad "${huge}"`),
    ]) {
      const { body } = sut.reply(exception, req);
      expect(body.error.length).toBeLessThan(1_100);
      expect(body.error).toMatch(/…\(\d+ bytes\)$/);
    }
  });

  it('sets Retry-After in whole seconds when the upstream said when to retry', () => {
    const reply = sut.reply(new RpcError(status.RESOURCE_EXHAUSTED, 'full', { retryDelayMs: 250 }), req);
    expect(reply.headers).toEqual({ 'retry-after': '1' });
    expect(sut.reply(new RpcError(status.RESOURCE_EXHAUSTED, 'full', { retryDelayMs: 2001 }), req).headers).toEqual({
      'retry-after': '3',
    });
    // A 503 from an open circuit says when the next attempt goes through.
    expect(
      sut.reply(new RpcError(status.UNAVAILABLE, 'circuit open', { reason: 'CIRCUIT_OPEN', retryDelayMs: 4200 }), req)
        .headers,
    ).toEqual({ 'retry-after': '5' });
    expect(sut.reply(new RpcError(status.RESOURCE_EXHAUSTED, 'full'), req).headers).toEqual({});
  });

  it('asks for a bearer token on 401', () => {
    expect(sut.reply(new RpcError(status.UNAUTHENTICATED, 'no key'), req).headers).toEqual({
      'www-authenticate': 'Bearer',
    });
  });

  it('keeps the status of HTTP exceptions: malformed bodies 400, oversized ones 413', () => {
    expect(sut.reply(new BadRequestException('malformed JSON body'), req)).toMatchObject({
      status: 400,
      body: { error: 'malformed JSON body' },
    });
    expect(sut.reply(new PayloadTooLargeException('too big'), req)).toMatchObject({
      status: 413,
      body: { error: 'too big' },
    });
  });

  it('answers 405 with Allow for a known path with the wrong method, 404 for an unknown path', () => {
    expect(
      sut.reply(new NotFoundException('Cannot GET /v2/models/m/infer'), { method: 'GET', path: '/v2/models/m/infer' }),
    ).toMatchObject({
      status: 405,
      headers: { allow: 'POST' },
    });
    expect(
      sut.reply(new NotFoundException('Cannot PUT /v2/models/m'), { method: 'PUT', path: '/v2/models/m/versions/2' }),
    ).toMatchObject({
      status: 405,
      headers: { allow: 'GET, HEAD' },
    });
    expect(sut.reply(new NotFoundException('Cannot GET /v1'), { method: 'GET', path: '/v1' })).toMatchObject({
      status: 404,
    });
  });

  it('answers an unexpected error 500 without its details, and logs it', () => {
    logged.length = 0;
    const reply = sut.reply(new TypeError('secret internals'), req);
    expect(reply).toEqual({ status: 500, body: { error: 'internal error' }, headers: {} });
    expect(logged.join('')).toContain('secret internals');
  });
});
