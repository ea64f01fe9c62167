import { Inject, Injectable, type NestMiddleware, type OnModuleDestroy } from '@nestjs/common';
import { Clock, OverdueSweep } from '@infermesh/clock';
import { sanitizeRequestId, spans } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import type { NextFunction, Request, Response } from 'express';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
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
 *
 * A response must have left whole GATEWAY_HTTP_SEND_TIMEOUT_MS after it began (its headers written),
 * else its connection is reset and the drop counted: a client that sends requests and never reads
 * their responses would otherwise hold each one, with the request's share of the body budget, for as
 * long as it keeps its connection (Node's HTTP server has no send timeout of its own).
 */
@Injectable()
export class RequestTracking implements NestMiddleware, OnModuleDestroy {
  private readonly sending: OverdueSweep<Response>;

  constructor(
    private readonly metrics: GatewayMetrics,
    @Inject(GATEWAY_CONFIG) config: GatewayConfig,
    clock: Clock,
  ) {
    this.sending = new OverdueSweep(clock, config.http.sendTimeoutMs);
  }

  onModuleDestroy(): void {
    this.sending.close();
  }

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
    this.sending.watch(
      res,
      () => {
        if (res.destroyed) return;
        this.metrics.countUndeliveredResponse(endpointOf(req, routeOf(req)));
        // Reset (RST), not closed: what the kernel still holds for the client is dropped too.
        if (res.socket !== null) res.socket.resetAndDestroy();
        else res.destroy();
      },
      () => res.headersSent,
    );
    // A response ends with 'close', finished or not.
    res.once('close', () => {
      this.sending.forget(res);
      const route = routeOf(req);
      const endpoint = endpointOf(req, route);
      const code = res.writableFinished ? String(res.statusCode) : '499';
      timer.end(endpoint, code, span);
      if (span !== undefined) {
        if (route !== undefined) span.updateName(endpoint).setAttribute('http.route', route);
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

/** The route template a request matched; undefined before routing, or when none matched. */
function routeOf(req: Request): string | undefined {
  const route = (req.route as { path?: unknown } | undefined)?.path;
  return typeof route === 'string' ? route : undefined;
}

/** A request's endpoint label: its method and route template, or `unmatched`. */
function endpointOf(req: Request, route: string | undefined): string {
  return route === undefined ? 'unmatched' : `${req.method} ${route}`;
}
