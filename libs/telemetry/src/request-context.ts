import { AsyncLocalStorage } from 'node:async_hooks';
import type { Span } from '@opentelemetry/api';
import { randomUUID } from 'node:crypto';

/** What travels with a request through every hop: its id and its deadline. */
export interface RequestContext {
  readonly requestId: string;
  /** Epoch milliseconds after which the work is no longer wanted. */
  readonly deadlineMs?: number;
  /** Aborted when the caller gives up (cancels its call or goes away): the calls it led to are cancelled too. */
  readonly signal?: AbortSignal;
  /**
   * The span of this hop's work, with tracing on (undefined when off): calls made for the request are
   * its children, log lines and latency exemplars carry its ids.
   */
  readonly span?: Span;
}

const storage = new AsyncLocalStorage<RequestContext>();

export const requestContext = {
  run<T>(context: RequestContext, fn: () => T): T {
    return storage.run(context, fn);
  },
  current(): RequestContext | undefined {
    return storage.getStore();
  },
  newRequestId(): string {
    return randomUUID();
  },
};

/** Request ids arrive from clients; only short printable ids are kept, others are replaced. */
export function sanitizeRequestId(candidate: string | undefined): string {
  if (candidate !== undefined && /^[\w.:-]{1,128}$/.test(candidate)) return candidate;
  return randomUUID();
}
