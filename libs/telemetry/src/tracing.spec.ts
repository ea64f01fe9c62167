import { SpanKind, SpanStatusCode } from '@opentelemetry/api';
import { InMemorySpanExporter } from '@opentelemetry/sdk-trace';
import { flushTracing, rpcAttributes, spans, startTracing, stopTracing } from './tracing';

/** The spans go to the spec's in-memory exporter: the OTLP URL is not used. */
const UNUSED_URL = 'http://127.0.0.1:1/v1/traces';

const TRACE = '0af7651916cd43dd8448eb211c80319c';
const PARENT = 'b7ad6b7169203331';

describe('spans with tracing off', () => {
  it('makes none and loads nothing of the SDK', () => {
    expect(spans.enabled).toBe(false);
    expect(spans.server('x', { traceparent: `00-${TRACE}-${PARENT}-01` }, {}, true)).toBeUndefined();
    expect(spans.child('x', undefined, {})).toBeUndefined();
    expect(Object.keys(require.cache).some((path) => path.includes('@opentelemetry/sdk-node'))).toBe(false);
  });
});

describe('spans with tracing on', () => {
  const exporter = new InMemorySpanExporter();

  beforeAll(() => startTracing('test', 'test-1', { tracesUrl: UNUSED_URL, ratio: 1, parentBased: true }, exporter));
  afterAll(() => stopTracing());

  /** The spans ended since the last call. */
  async function exported() {
    await flushTracing();
    const finished = exporter.getFinishedSpans();
    exporter.reset();
    return finished;
  }

  it("continues the caller's trace, passes it on, and makes a step of the work a child", async () => {
    const server = spans.server(
      'pkg.Service/Method',
      { traceparent: `00-${TRACE}-${PARENT}-01`, tracestate: 'vendor=1' },
      rpcAttributes('/pkg.Service/Method'),
      false,
    )!;
    expect(spans.propagate(server)).toEqual({
      traceparent: `00-${TRACE}-${server.spanContext().spanId}-01`,
      tracestate: 'vendor=1',
    });
    const step = spans.child('step', server, { a: 1 })!;
    spans.end(step, new Error('the step failed'));
    spans.endCall(server, 0);
    const [stepSpan, serverSpan] = await exported();
    expect(serverSpan!.spanContext().traceId).toBe(TRACE);
    expect(serverSpan!.parentSpanContext?.spanId).toBe(PARENT);
    expect(serverSpan!.kind).toBe(SpanKind.SERVER);
    expect(serverSpan!.attributes).toEqual({
      'rpc.system': 'grpc',
      'rpc.service': 'pkg.Service',
      'rpc.method': 'Method',
      'rpc.grpc.status_code': 0,
    });
    expect(stepSpan!.kind).toBe(SpanKind.INTERNAL);
    expect(stepSpan!.parentSpanContext?.spanId).toBe(serverSpan!.spanContext().spanId);
    expect(stepSpan!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'the step failed' });
  });

  it('starts a trace only where a root is allowed (the public edge), and ignores a malformed traceparent there', async () => {
    expect(spans.server('inner', {}, {}, false)).toBeUndefined();
    expect(spans.server('inner', { traceparent: 'garbage' }, {}, false)).toBeUndefined();
    const edge = spans.server('edge', { traceparent: 'garbage' }, {}, true)!;
    spans.endCall(edge, 0);
    const [span] = await exported();
    expect(span!.parentSpanContext).toBeUndefined();
  });

  it("counts as a server's failure only the codes that are its own", async () => {
    for (const code of [3, 5, 7, 13, 14]) spans.endCall(spans.server(`s${code}`, {}, {}, true), code);
    const byName = Object.fromEntries((await exported()).map((s) => [s.name, s.status.code]));
    expect(byName).toEqual({
      s3: SpanStatusCode.UNSET,
      s5: SpanStatusCode.UNSET,
      s7: SpanStatusCode.UNSET,
      s13: SpanStatusCode.ERROR,
      s14: SpanStatusCode.ERROR,
    });
  });

  it('follows a caller that does not sample: no span, at the edge or inside', async () => {
    expect(spans.server('inner', { traceparent: `00-${TRACE}-${PARENT}-00` }, {}, false)).toBeUndefined();
    expect(spans.server('edge', { traceparent: `00-${TRACE}-${PARENT}-00` }, {}, true)).toBeUndefined();
    expect(await exported()).toEqual([]);
  });
});

describe('spans with a ratio', () => {
  const exporter = new InMemorySpanExporter();

  beforeAll(() => startTracing('test', 'test-1', { tracesUrl: UNUSED_URL, ratio: 0.25, parentBased: true }, exporter));
  afterAll(() => stopTracing());

  async function exported() {
    await flushTracing();
    return exporter.getFinishedSpans();
  }

  it('keeps the configured share of new traces, deciding before any span is made', async () => {
    const made = Array.from({ length: 4000 }, () => spans.server('edge', {}, {}, true)).filter(
      (span) => span !== undefined,
    );
    for (const span of made) spans.end(span);
    expect(made.length).toBeGreaterThan(800);
    expect(made.length).toBeLessThan(1200);
    expect((await exported()).length).toBe(made.length);
    // A sampled caller's trace is followed whatever the ratio.
    expect(spans.server('inner', { traceparent: `00-${TRACE}-${PARENT}-01` }, {}, false)?.isRecording()).toBe(true);
  });
});
