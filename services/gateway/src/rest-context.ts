import { BadRequestException } from '@nestjs/common';
import { requestContext } from '@infermesh/telemetry';
import type { Request, Response } from 'express';
import { restRequestId } from './request-tracking.middleware';

/** The header a REST client sets to give its request a deadline, in milliseconds from now. */
export const TIMEOUT_HEADER = 'x-request-timeout-ms';

function headerTimeoutMs(req: Request): number | undefined {
  const value = req.header(TIMEOUT_HEADER);
  if (value === undefined) return undefined;
  if (!/^\d{1,10}$/.test(value.trim()) || Number(value) <= 0) {
    throw new BadRequestException(`${TIMEOUT_HEADER} must be a positive integer of milliseconds`);
  }
  return Number(value);
}

/** Aborted when the client goes away before its response is complete. */
export function clientGone(res: Response): AbortSignal {
  const aborted = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) aborted.abort();
  });
  return aborted.signal;
}

export interface RestDeadline {
  /** A timeout the request itself names (Triton's `timeout` parameter). */
  parameterTimeoutMs?: number | undefined;
  /** The deadline of a request that names none; undefined: none. */
  defaultTimeoutMs: number | undefined;
}

/**
 * Runs a use case inside the REST request's context: its id, its deadline (the earliest of the
 * `x-request-timeout-ms` header and the request's own timeout, else the default) and, when given,
 * a signal that cancels it. Upstream calls made inside carry all three.
 */
export function withinRequest<T>(req: Request, res: Response, deadline: RestDeadline, fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
  const timeouts = [headerTimeoutMs(req), deadline.parameterTimeoutMs].filter((t): t is number => t !== undefined);
  const timeoutMs = timeouts.length > 0 ? Math.min(...timeouts) : deadline.defaultTimeoutMs;
  return requestContext.run(
    {
      requestId: restRequestId(res),
      ...(timeoutMs !== undefined && { deadlineMs: Date.now() + timeoutMs }),
      ...(signal !== undefined && { signal }),
    },
    fn,
  );
}
