import { status } from '@grpc/grpc-js';
// The filter recognises the exceptions Nest itself throws (an unmatched route) to answer them as catalogue
// errors; nothing in the gateway throws them.
// eslint-disable-next-line no-restricted-imports
import { type ArgumentsHost, Catch, type ExceptionFilter, HttpException, NotFoundException } from '@nestjs/common';
import { Errors, RpcError, type RpcErrorOptions } from '@infermesh/grpc';
import { JsonLogger } from '@infermesh/telemetry';
import type { Request, Response } from 'express';
import { allowedMethods } from './rest-routes';

export interface HttpErrorReply {
  status: number;
  body: { error: string };
  headers: Record<string, string>;
}

/** The catalogue error of an HttpException Nest throws itself, by its status; others are not expected. */
const NEST_EXCEPTIONS: Readonly<Record<number, (message: string, options?: RpcErrorOptions) => RpcError>> = {
  400: Errors.invalidRequest,
  401: Errors.unauthenticated,
  403: Errors.permissionDenied,
  404: Errors.routeNotFound,
  405: Errors.methodNotAllowed,
  413: Errors.payloadTooLarge,
  415: Errors.unsupportedMediaType,
};

/**
 * Every failure of a REST request as `{"error": "..."}` with its catalogue error's HTTP status
 * (RpcError.httpStatus: its reason's, or its code's for an error received without one): 429 or 503
 * with Retry-After when the error says when to retry, 401 with WWW-Authenticate. Nest's own
 * exceptions become catalogue errors first: an unknown route ROUTE_NOT_FOUND (404), a known path
 * asked with the wrong method METHOD_NOT_ALLOWED (405, with Allow). Anything else, a bug, is logged
 * and answered 500.
 */
@Catch()
export class HttpErrorFilter implements ExceptionFilter {
  constructor(private readonly logger: JsonLogger) {}

  catch(exception: unknown, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    const req = http.getRequest<Request>();
    const res = http.getResponse<Response>();
    const reply = this.reply(exception, req);
    if (res.headersSent) {
      res.end();
      return;
    }
    // Refused before its body was read (a 401 to an upload, say): the connection closes rather than drains it.
    const hasBody = Number(req.headers['content-length']) > 0 || req.headers['transfer-encoding'] !== undefined;
    if (hasBody && !req.complete) res.setHeader('connection', 'close');
    for (const [name, value] of Object.entries(reply.headers)) res.setHeader(name, value);
    res.status(reply.status).json(reply.body);
  }

  reply(exception: unknown, req: Pick<Request, 'method' | 'path'>): HttpErrorReply {
    const error = catalogueError(exception, req);
    if (error === undefined) {
      this.logger.error('unexpected error', exception instanceof Error ? exception : new Error(String(exception)));
      return { status: 500, body: { error: 'internal error' }, headers: {} };
    }
    const httpStatus = error.httpStatus;
    const headers: Record<string, string> = {};
    if (httpStatus === 401) headers['www-authenticate'] = 'Bearer';
    if (httpStatus === 405 && error.metadata['allow'] !== undefined) headers['allow'] = error.metadata['allow'];
    if ((httpStatus === 429 || httpStatus === 503) && error.retryDelayMs !== undefined) {
      headers['retry-after'] = String(Math.max(1, Math.ceil(error.retryDelayMs / 1000)));
    }
    if (httpStatus === 500) this.logger.error('request failed', { code: status[error.code], err: error.message });
    return { status: httpStatus, body: { error: error.message }, headers };
  }
}

/** The failure as a catalogue error; undefined for one that is neither an RpcError nor an exception Nest throws. */
function catalogueError(exception: unknown, req: Pick<Request, 'method' | 'path'>): RpcError | undefined {
  if (exception instanceof RpcError) return exception;
  if (exception instanceof NotFoundException) {
    // Nest's answer when no route matches: a known path asked with another method is a 405.
    const allowed = allowedMethods(req.path);
    if (allowed !== undefined && !allowed.includes(req.method)) {
      return Errors.methodNotAllowed(`${req.method} is not allowed on ${req.path}; use ${allowed.join(' or ')}`, {
        metadata: { allow: allowed.join(', ') },
      });
    }
  }
  if (exception instanceof HttpException) return NEST_EXCEPTIONS[exception.getStatus()]?.(messageOf(exception));
  return undefined;
}

function messageOf(exception: HttpException): string {
  const response = exception.getResponse();
  if (typeof response === 'string') return response;
  const message = (response as { message?: unknown }).message;
  return typeof message === 'string' ? message : exception.message;
}
