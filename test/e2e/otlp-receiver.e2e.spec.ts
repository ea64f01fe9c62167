import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import {
  ExportTraceServiceRequestSchema,
  ExportTraceServiceResponseSchema,
} from '@infermesh/proto/gen/opentelemetry/proto/collector/trace/v1/trace_service_pb';
import { Span_SpanKind, Status_StatusCode } from '@infermesh/proto/gen/opentelemetry/proto/trace/v1/trace_pb';
import { spawn } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import { OtlpReceiver } from './support/otlp-receiver';
import { REPO_ROOT } from './support/system-fixture';

/**
 * Runs `body` (JavaScript, awaited, its value printed as JSON) in a Node process with the real
 * OpenTelemetry SDK and OTLP/HTTP protobuf exporter the services use, exporting to `endpoint`.
 * A process of its own because the exporter loads `http` with a dynamic import(), which Jest's module
 * sandbox refuses without --experimental-vm-modules.
 */
async function runSdk(endpoint: string, body: string): Promise<unknown> {
  const script = `
    const { SpanKind, SpanStatusCode, context, trace } = require('@opentelemetry/api');
    const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
    const { resourceFromAttributes } = require('@opentelemetry/resources');
    const { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } = require('@opentelemetry/sdk-trace');
    const url = ${JSON.stringify(`${endpoint}/v1/traces`)};
    const provider = (exporter) => new TracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'receiver-spec', 'service.namespace': 'infermesh' }),
      spanProcessors: [new SimpleSpanProcessor({ exporter })],
    });
    (async () => { ${body} })().then(
      (value) => process.stdout.write(JSON.stringify(value)),
      (error) => { process.stderr.write(String(error && error.stack)); process.exitCode = 1; },
    );
  `;
  const child = spawn(process.execPath, ['-e', script], { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', resolve);
  });
  if (code !== 0) throw new Error(`the OpenTelemetry SDK process exited with ${code}: ${stderr}`);
  return JSON.parse(stdout);
}

type Ids = { traceId: string; spanId: string };

describe(OtlpReceiver.name, () => {
  let sut: OtlpReceiver;

  beforeEach(async () => {
    sut = new OtlpReceiver();
    await sut.start();
  });

  afterEach(async () => {
    await sut.stop();
  });

  const post = (
    receiver: OtlpReceiver,
    body: Uint8Array,
    headers: Record<string, string> = { 'content-type': 'application/x-protobuf' },
    path = '/v1/traces',
  ) => fetch(`${receiver.endpoint}${path}`, { method: 'POST', headers, body });
  const exportOf = (...names: string[]) =>
    toBinary(
      ExportTraceServiceRequestSchema,
      create(ExportTraceServiceRequestSchema, {
        resourceSpans: [
          {
            scopeSpans: [
              {
                spans: names.map((name, i) => ({
                  traceId: new Uint8Array(16).fill(1),
                  spanId: new Uint8Array(8).fill(i + 2),
                  name,
                })),
              },
            ],
          },
        ],
      }),
    );

  it('decodes the ids, parent, kind, attributes, events, links, status and service of what the OpenTelemetry SDK exports', async () => {
    const ids = (await runSdk(
      sut.endpoint,
      `
      const tracerProvider = provider(new OTLPTraceExporter({ url }));
      const tracer = tracerProvider.getTracer('receiver-spec');
      const batch = tracer.startSpan('batch');
      batch.end();
      const parent = tracer.startSpan('parent', { kind: SpanKind.SERVER });
      const child = tracer.startSpan('child', {
        kind: SpanKind.CLIENT,
        attributes: { 'rpc.system': 'grpc', 'rpc.grpc.status_code': 14, 'infermesh.cached': false, 'infermesh.ratio': 0.25, 'infermesh.shape': [1, 4] },
        links: [{ context: batch.spanContext(), attributes: { 'infermesh.batch.size': 8 } }],
      }, trace.setSpan(context.active(), parent));
      child.addEvent('retry', { 'retry.attempt': 2, 'retry.reason': 'unavailable' });
      child.setStatus({ code: SpanStatusCode.ERROR, message: 'worker unavailable' });
      child.end();
      parent.end();
      await tracerProvider.forceFlush();
      await tracerProvider.shutdown();
      return { batch: batch.spanContext(), parent: parent.spanContext(), child: child.spanContext() };
      `,
    )) as Record<'batch' | 'parent' | 'child', Ids>;

    expect(sut.spanCount).toBe(3);
    expect(sut.exports).toBe(3); // the simple processor exports each span on its own
    const byName = (name: string) => sut.spans.find((s) => s.name === name)!;
    const [child, parent, batch] = [byName('child'), byName('parent'), byName('batch')];
    expect(parent).toMatchObject({
      traceId: ids.parent.traceId,
      spanId: ids.parent.spanId,
      parentSpanId: '',
      kind: Span_SpanKind.SERVER,
      service: 'receiver-spec',
      status: { code: Status_StatusCode.UNSET, message: '' },
    });
    expect(child).toEqual({
      traceId: ids.parent.traceId,
      spanId: ids.child.spanId,
      parentSpanId: ids.parent.spanId,
      name: 'child',
      kind: Span_SpanKind.CLIENT,
      service: 'receiver-spec',
      attributes: {
        'rpc.system': 'grpc',
        'rpc.grpc.status_code': 14,
        'infermesh.cached': false,
        'infermesh.ratio': 0.25,
        'infermesh.shape': [1, 4],
      },
      events: [{ name: 'retry', attributes: { 'retry.attempt': 2, 'retry.reason': 'unavailable' } }],
      links: [{ traceId: ids.batch.traceId, spanId: ids.batch.spanId, attributes: { 'infermesh.batch.size': 8 } }],
      status: { code: Status_StatusCode.ERROR, message: 'worker unavailable' },
      startNs: expect.any(BigInt),
      endNs: expect.any(BigInt),
    });
    expect([child.traceId, child.spanId]).toEqual([
      expect.stringMatching(/^[0-9a-f]{32}$/),
      expect.stringMatching(/^[0-9a-f]{16}$/),
    ]);
    expect(batch.traceId).not.toBe(child.traceId);
    // Nanoseconds since the epoch, within the last minute, the child inside its parent.
    expect(child.startNs).toBeGreaterThan(BigInt(Date.now() - 60_000) * 1_000_000n);
    expect(child.startNs).toBeGreaterThanOrEqual(parent.startNs);
    expect(child.endNs).toBeGreaterThanOrEqual(child.startNs);
  });

  it('accepts gzipped exports, and the exporter reads its answer as a success', async () => {
    const result = await runSdk(
      sut.endpoint,
      `
      const memory = new InMemorySpanExporter();
      const tracerProvider = provider(memory);
      tracerProvider.getTracer('receiver-spec').startSpan('zipped', { attributes: { 'infermesh.model': 'tiny' } }).end();
      await tracerProvider.forceFlush();
      const exporter = new OTLPTraceExporter({ url, compression: 'gzip' });
      const result = await new Promise((resolve) => exporter.export(memory.getFinishedSpans(), resolve));
      await exporter.shutdown();
      return result;
      `,
    );

    const byHand = await post(sut, gzipSync(exportOf('zipped by hand')), {
      'content-type': 'application/x-protobuf',
      'content-encoding': 'gzip',
    });
    const notZipped = await post(sut, exportOf('not zipped'), {
      'content-type': 'application/x-protobuf',
      'content-encoding': 'gzip',
    });

    expect(result).toEqual({ code: 0 }); // ExportResultCode.SUCCESS
    expect(byHand.status).toBe(200);
    expect([notZipped.status, await notZipped.text()]).toEqual([400, expect.stringContaining('gzip')]);
    expect(sut.spans.map((s) => [s.name, s.attributes])).toEqual([
      ['zipped', { 'infermesh.model': 'tiny' }],
      ['zipped by hand', {}],
    ]);
  });

  it('refuses what is not an OTLP protobuf export with a reason, and goes on receiving', async () => {
    // Field 1 (resource_spans) announces 5 bytes and ends after 1.
    const truncated = new Uint8Array([0x0a, 0x05, 0x01]);

    const garbage = await post(sut, truncated);
    const json = await post(sut, new TextEncoder().encode('{"resourceSpans":[]}'), {
      'content-type': 'application/json',
    });
    const wrongPath = await post(sut, truncated, undefined, '/v1/metrics');
    const get = await fetch(`${sut.endpoint}/v1/traces`);

    expect([garbage.status, await garbage.text()]).toEqual([
      400,
      expect.stringContaining('not an ExportTraceServiceRequest'),
    ]);
    expect([json.status, await json.text()]).toEqual([415, expect.stringContaining('application/x-protobuf')]);
    expect([wrongPath.status, await wrongPath.text()]).toEqual([404, expect.stringContaining('/v1/metrics')]);
    expect([get.status, get.headers.get('allow')]).toEqual([405, 'POST']);
    expect(sut.rejected).toBe(4);

    const ok = await post(sut, exportOf('after'));
    expect([ok.status, ok.headers.get('content-type')]).toEqual([200, 'application/x-protobuf']);
    expect(
      fromBinary(ExportTraceServiceResponseSchema, new Uint8Array(await ok.arrayBuffer())).partialSuccess,
    ).toBeUndefined();
    expect(sut.spans.map((s) => [s.name, s.traceId, s.spanId, s.service])).toEqual([
      ['after', '01'.repeat(16), '02'.repeat(8), ''],
    ]);
    expect([sut.exports, sut.spanCount]).toEqual([1, 1]);
  });

  it('waits for spans that arrive later, and says what arrived when they do not', async () => {
    const late = setTimeout(() => void post(sut, exportOf('late')), 300);
    try {
      const span = await sut.waitFor((spans) => spans.find((s) => s.name === 'late'), 10_000);

      expect(span.spanId).toBe('02'.repeat(8));
      await expect(sut.waitFor((spans) => spans.find((s) => s.name === 'never'), 200)).rejects.toThrow(
        '1 spans in 1 exports',
      );
    } finally {
      clearTimeout(late);
    }
  });

  it('only counts spans with keep: false, and clear() forgets them', async () => {
    const counting = new OtlpReceiver({ keep: false });
    await counting.start();
    try {
      await post(counting, exportOf('a', 'b', 'c'));
      await post(counting, exportOf('d', 'e'));

      expect([counting.spanCount, counting.exports, counting.spans.length]).toEqual([5, 2, 0]);
      counting.clear();
      expect([counting.spanCount, counting.exports]).toEqual([0, 0]);
    } finally {
      await counting.stop();
    }
  });
});
