import {
  type Attributes,
  context,
  type ContextManager,
  defaultTextMapGetter,
  type Link,
  propagation,
  type ProxyTracerProvider,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
} from '@opentelemetry/api';
import type { TracingSettings } from '@infermesh/config';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import type { SpanExporter, TracerProvider } from '@opentelemetry/sdk-trace';

/** gRPC codes a server counts as its own failure (the RPC semantic conventions' server-side errors). */
const SERVER_ERRORS = new Set([2, 4, 12, 13, 14, 15]); // UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS

const propagator = new W3CTraceContextPropagator();

let tracer: Tracer | undefined;
/** Whether a span follows its parent's sampling decision (parentbased_* samplers). */
let followParent = true;
/** The share of new traces kept (parent-based samplers: decided here, before a span is made). */
let rootRatio = 1;
let shutdown: (() => Promise<void>) | undefined;

/** The W3C trace context headers of a call: what a caller sent, what a call sends. */
export interface TraceHeaders {
  traceparent?: string | undefined;
  tracestate?: string | undefined;
}

/**
 * Turns tracing on for this process: OpenTelemetry's Node SDK with spans batched and exported as
 * OTLP http/protobuf (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_*…), a
 * resource naming the service and its instance, and no automatic instrumentation: the spans are
 * ours (libs/grpc's server and client, the gateway's REST edge, the batcher's batches, the worker's
 * runs). With tracing off nothing of the SDK is loaded, no span is made and no header is sent.
 */
export function startTracing(
  service: string,
  instanceId: string,
  settings: TracingSettings,
  exporter?: SpanExporter,
): void {
  if (tracer !== undefined) return;
  // Loaded only when tracing is on: with it off the SDK costs nothing, not even its loading.
  /* eslint-disable @typescript-eslint/no-require-imports */
  const { NodeSDK } = require('@opentelemetry/sdk-node') as typeof import('@opentelemetry/sdk-node');
  const { OTLPTraceExporter } =
    require('@opentelemetry/exporter-trace-otlp-proto') as typeof import('@opentelemetry/exporter-trace-otlp-proto');
  const { AlwaysOnSampler, ParentBasedSampler, TraceIdRatioBasedSampler } =
    require('@opentelemetry/sdk-trace') as typeof import('@opentelemetry/sdk-trace');
  const { resourceFromAttributes } = require('@opentelemetry/resources') as typeof import('@opentelemetry/resources');
  /* eslint-enable @typescript-eslint/no-require-imports */
  // Parent-based, a new trace's decision is taken before any span is made (see spans.server), so
  // that an unsampled request costs no span at all; the SDK samples what it is given.
  const sampler = settings.parentBased
    ? new ParentBasedSampler({ root: new AlwaysOnSampler() })
    : new TraceIdRatioBasedSampler(settings.ratio);
  const sdk = new NodeSDK({
    resource: resourceFromAttributes({
      'service.name': service,
      'service.namespace': 'infermesh',
      'service.instance.id': instanceId,
    }),
    sampler,
    // The given exporter is a test's; it is batched all the same.
    traceExporter: exporter ?? new OTLPTraceExporter({ url: settings.tracesUrl }),
    // Traces only: metrics are Prometheus' (GET /metrics), logs go to stdout.
    metricReaders: [],
    logRecordProcessors: [],
    instrumentations: [],
    textMapPropagator: propagator,
    // No context manager: every span here is given its parent (the request's context carries it),
    // so OpenTelemetry's own AsyncLocalStorage would only add work to every asynchronous step.
    contextManager: null as unknown as ContextManager,
  });
  sdk.start();
  tracer = trace.getTracer('infermesh');
  followParent = settings.parentBased;
  rootRatio = settings.ratio;
  shutdown = async () => {
    await sdk.shutdown();
    // Unregistered, so that tracing can start again in this process (tests do).
    trace.disable();
    context.disable();
    propagation.disable();
  };
}

/** Exports the spans ended so far, now, instead of with the next batch. */
export async function flushTracing(): Promise<void> {
  if (tracer === undefined) return;
  await ((trace.getTracerProvider() as ProxyTracerProvider).getDelegate() as TracerProvider).forceFlush();
}

/** Exports the spans still buffered and stops tracing (the service's last step). */
export async function stopTracing(): Promise<void> {
  const done = shutdown;
  tracer = undefined;
  shutdown = undefined;
  await done?.();
}

/**
 * The spans of infermesh's hops. Every function returns undefined with tracing off, and takes an
 * undefined parent as "not traced": a call made outside any traced request (a poll, a heartbeat)
 * makes no span and sends no trace context, so the spans exported are those of requests.
 */
export const spans = {
  get enabled(): boolean {
    return tracer !== undefined;
  },

  /**
   * The span of a call this service received: the child of the caller's span when its headers carry
   * one; without, a new trace only where `root` allows it (the public edge), else none.
   */
  server(name: string, headers: TraceHeaders, attributes: Attributes, root: boolean): Span | undefined {
    if (tracer === undefined) return undefined;
    const parent =
      headers.traceparent === undefined ? undefined : propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
    const parentContext = parent === undefined ? undefined : trace.getSpanContext(parent);
    if (parentContext === undefined) {
      // A new trace (a malformed traceparent counts as none), kept as the ratio says.
      if (!root || (followParent && rootRatio < 1 && Math.random() >= rootRatio)) return undefined;
      return tracer.startSpan(name, { kind: SpanKind.SERVER, attributes, root: true });
    }
    // A caller's trace that it does not sample: nothing here would be recorded.
    if (followParent && !sampled(parentContext.traceFlags)) return undefined;
    return tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
  },

  /**
   * A step of a traced request's own work (a batch, a model run, a mirrored request). Under a parent
   * that is not sampled, none: it would record nothing.
   */
  child(name: string, parent: Span | undefined, attributes: Attributes, links?: Link[]): Span | undefined {
    if (tracer === undefined || parent === undefined) return undefined;
    if (followParent && !sampled(parent.spanContext().traceFlags)) return undefined;
    return tracer.startSpan(
      name,
      { kind: SpanKind.INTERNAL, attributes, ...(links !== undefined && { links }) },
      trace.setSpan(ROOT_CONTEXT, parent),
    );
  },

  /**
   * The W3C headers a call made inside this span carries, so that the callee's span is its child;
   * none when the trace is not sampled (the callee, following the decision, would record nothing).
   */
  propagate(span: Span): { traceparent: string; tracestate?: string } | undefined {
    const { traceId, spanId, traceFlags, traceState } = span.spanContext();
    if (tracer === undefined || (followParent && !sampled(traceFlags))) return undefined;
    const traceparent = `00-${traceId}-${spanId}-0${traceFlags & 1}`;
    const state = traceState?.serialize();
    return state === undefined || state === '' ? { traceparent } : { traceparent, tracestate: state };
  },

  /**
   * Ends the span of a call received with its gRPC status: an error only for the failures that are
   * the server's own (a caller's bad input is not), as the RPC conventions say.
   */
  endCall(span: Span | undefined, code: number, message?: string): void {
    if (span === undefined) return;
    span.setAttribute('rpc.grpc.status_code', code);
    if (SERVER_ERRORS.has(code))
      span.setStatus({ code: SpanStatusCode.ERROR, ...(message !== undefined && { message }) });
    span.end();
  },

  /** Ends a span of the service's own work, an error when it failed. */
  end(span: Span | undefined, error?: unknown): void {
    if (span === undefined) return;
    if (error !== undefined)
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: error instanceof Error ? error.message : typeof error === 'string' ? error : 'failed',
      });
    span.end();
  },
};

function sampled(traceFlags: number): boolean {
  return (traceFlags & 1) === 1;
}

/** Attributes of an RPC span (the RPC semantic conventions): its system, service and method, from `/pkg.Service/Method`. */
export function rpcAttributes(path: string): Attributes {
  const slash = path.lastIndexOf('/');
  return { 'rpc.system': 'grpc', 'rpc.service': path.slice(1, slash), 'rpc.method': path.slice(slash + 1) };
}
