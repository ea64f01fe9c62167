import { status } from '@grpc/grpc-js';
import { type ArgumentsHost, Catch, type ExceptionFilter, HttpException, NotFoundException } from '@nestjs/common';
import { MAX_ERROR_MESSAGE_CHARS, RpcError } from '@infermesh/grpc';
import { boundedText } from '@infermesh/tensors';
import { JsonLogger } from '@infermesh/telemetry';
import type { Request, Response } from 'express';
import { httpStatusOf } from './http-status';
import { allowedMethods } from './rest-routes';

export interface HttpErrorReply {
  status: number;
  body: { error: string };
  headers: Record<string, string>;
}

/**
 * Every failure of a REST request as `{"error": "..."}` with the Open Inference Protocol's status:
 * RpcErrors by their gRPC code (429 or 503 with Retry-After when the upstream said when to retry), Nest's
 * HTTP exceptions by their status (unknown route 404, a known path with the wrong method 405), and
 * anything else, a bug, logged and answered 500.
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
    if (exception instanceof RpcError) {
      const headers: Record<string, string> = {};
      if (exception.code === status.UNAUTHENTICATED) headers['www-authenticate'] = 'Bearer';
      const retriable = exception.code === status.RESOURCE_EXHAUSTED || exception.code === status.UNAVAILABLE;
      if (retriable && exception.retryDelayMs !== undefined) {
        headers['retry-after'] = String(Math.max(1, Math.ceil(exception.retryDelayMs / 1000)));
      }
      const code = httpStatusOf(exception.code);
      if (code === 500) this.logger.error('request failed', { code: status[exception.code], err: exception.message });
      return { status: code, body: { error: exception.message }, headers };
    }
    if (exception instanceof NotFoundException) {
      const allowed = allowedMethods(req.path);
      if (allowed !== undefined && !allowed.includes(req.method)) {
        return {
          status: 405,
          body: { error: `${req.method} is not allowed on ${req.path}; use ${allowed.join(' or ')}` },
          headers: { allow: allowed.join(', ') },
        };
      }
    }
    if (exception instanceof HttpException) {
      const response = exception.getResponse();
      const message =
        typeof response === 'string'
          ? response
          : typeof (response as { message?: unknown }).message === 'string'
            ? (response as { message: string }).message
            : exception.message;
      return {
        status: exception.getStatus(),
        body: { error: boundedText(message, MAX_ERROR_MESSAGE_CHARS) },
        headers: {},
      };
    }
    this.logger.error('unexpected error', exception instanceof Error ? exception : new Error(String(exception)));
    return { status: 500, body: { error: 'internal error' }, headers: {} };
  }
}
