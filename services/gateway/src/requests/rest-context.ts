import { requestContext } from '@infermesh/telemetry';
import type { Request, Response } from 'express';
import { headerTimeoutMs, requestDeadline, TIMEOUT_HEADER } from './request-deadline';
import { restRequestId, restSpan } from './request-tracking.middleware';

export { TIMEOUT_HEADER };

/** Aborted when the client goes away before its response is complete. */
export function clientGone(res: Response): AbortSignal {
  const aborted = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) aborted.abort();
  });
  return aborted.signal;
}

export interface RestDeadline {
  /** The time now on the gateway's wall clock (Clock.now()), epoch milliseconds. */
  nowMs: number;
  /** A timeout the request itself names (Triton's `timeout` parameter). */
  parameterTimeoutMs?: number | undefined;
  /** The deadline of a request that names none; undefined: none. */
  defaultTimeoutMs: number | undefined;
  /** The longest deadline a request gets (GATEWAY_MAX_REQUEST_TIMEOUT_MS). */
  maxTimeoutMs: number;
}

/**
 * Runs a use case inside the REST request's context: its id, its deadline (the earliest of the
 * `x-request-timeout-ms` header and the request's own timeout, else the default, at most the
 * maximum) and, when given, a signal that cancels it. Upstream calls made inside carry all three.
 */
export function withinRequest<T>(
  req: Request,
  res: Response,
  deadline: RestDeadline,
  fn: () => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  const sources = {
    headerTimeoutMs: headerTimeoutMs(req.header(TIMEOUT_HEADER)),
    parameterTimeoutMs: deadline.parameterTimeoutMs,
  };
  const named = sources.headerTimeoutMs !== undefined || sources.parameterTimeoutMs !== undefined;
  const deadlineMs =
    named || deadline.defaultTimeoutMs !== undefined
      ? requestDeadline(
          sources,
          { defaultMs: deadline.defaultTimeoutMs ?? deadline.maxTimeoutMs, maxMs: deadline.maxTimeoutMs },
          deadline.nowMs,
        )
      : undefined;
  const span = restSpan(res);
  return requestContext.run(
    {
      requestId: restRequestId(res),
      ...(span !== undefined && { span }),
      ...(deadlineMs !== undefined && { deadlineMs }),
      ...(signal !== undefined && { signal }),
    },
    fn,
  );
}
