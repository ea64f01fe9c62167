import { Injectable, type NestMiddleware } from '@nestjs/common';
import { sanitizeRequestId, spans } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import type { NextFunction, Request, Response } from 'express';
import { GatewayMetrics } from '../gateway-metrics';

/** The sanitized request id of a REST request, set by RequestTracking. */
export function restRequestId(res: Response): string {
  return res.locals['requestId'] as string;
}

/** The span of a REST request (tracing on), set by RequestTracking. */
export function restSpan(res: Response): Span | undefined {
  return res.locals['span'] as Span | undefined;
}

/**
 * First for every REST request, matched or not: takes the client's `x-request-id` (or makes one),
 * echoes it on the response, and records the request's duration under its route template. With
 * tracing on, the request is a span (HTTP semantic conventions): the child of the client's
 * `traceparent`, else the root of a new trace.
 */
@Injectable()
export class RequestTracking implements NestMiddleware {
  constructor(private readonly metrics: GatewayMetrics) {}

  use(req: Request, res: Response, next: NextFunction): void {
    const timer = this.metrics.startRequest('rest');
    const requestId = sanitizeRequestId(req.header('x-request-id'));
    res.locals['requestId'] = requestId;
    res.setHeader('x-request-id', requestId);
    const span = spans.enabled
      ? spans.server(
          req.method,
          { traceparent: req.header('traceparent'), tracestate: req.header('tracestate') },
          { 'http.request.method': req.method, 'url.path': req.path, 'infermesh.request_id': requestId },
          true,
        )
      : undefined;
    if (span !== undefined) res.locals['span'] = span;
    res.once('close', () => {
      const route = (req.route as { path?: unknown } | undefined)?.path;
      const endpoint = typeof route === 'string' ? `${req.method} ${route}` : 'unmatched';
      const code = res.writableFinished ? String(res.statusCode) : '499';
      timer.end(endpoint, code, span);
      if (span !== undefined) {
        if (typeof route === 'string') span.updateName(endpoint).setAttribute('http.route', route);
        span.setAttribute('http.response.status_code', res.statusCode);
        spans.end(
          span,
          res.statusCode >= 500
            ? `HTTP ${res.statusCode}`
            : !res.writableFinished
              ? 'the client went away before the response was complete'
              : undefined,
        );
      }
    });
    next();
  }
}
