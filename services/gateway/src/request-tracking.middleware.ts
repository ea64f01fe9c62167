import { Injectable, type NestMiddleware } from '@nestjs/common';
import { sanitizeRequestId } from '@infermesh/telemetry';
import type { NextFunction, Request, Response } from 'express';
import { GatewayMetrics } from './gateway-metrics';

/** The sanitized request id of a REST request, set by RequestTracking. */
export function restRequestId(res: Response): string {
  return res.locals['requestId'] as string;
}

/**
 * First for every REST request, matched or not: takes the client's `x-request-id` (or makes one),
 * echoes it on the response, and records the request's duration under its route template.
 */
@Injectable()
export class RequestTracking implements NestMiddleware {
  constructor(private readonly metrics: GatewayMetrics) {}

  use(req: Request, res: Response, next: NextFunction): void {
    const start = process.hrtime.bigint();
    const requestId = sanitizeRequestId(req.header('x-request-id'));
    res.locals['requestId'] = requestId;
    res.setHeader('x-request-id', requestId);
    res.once('close', () => {
      const route = (req.route as { path?: unknown } | undefined)?.path;
      const endpoint = typeof route === 'string' ? `${req.method} ${route}` : 'unmatched';
      const code = res.writableFinished ? String(res.statusCode) : '499';
      this.metrics.observeRequest('rest', endpoint, code, start);
    });
    next();
  }
}
