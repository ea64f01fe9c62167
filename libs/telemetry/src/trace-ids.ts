import { isSpanContextValid, type Span } from '@opentelemetry/api';
import { requestContext } from './request-context';

/** A span's ids as logs and exemplars carry them (W3C hex), and whether the trace is sampled (exported). */
export interface TraceIds {
  traceId: string;
  spanId: string;
  sampled: boolean;
}

/** The ids of a span, by default the current hop's; undefined with tracing off or an invalid span. */
export function traceIdsOf(span: Span | undefined = requestContext.current()?.span): TraceIds | undefined {
  if (span === undefined) return undefined;
  const context = span.spanContext();
  if (!isSpanContextValid(context)) return undefined;
  return {
    traceId: context.traceId,
    spanId: context.spanId,
    sampled: (context.traceFlags & 1) === 1 /* TraceFlags.SAMPLED */,
  };
}
