import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildTinyModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { Span_SpanKind, Status_StatusCode } from '@infermesh/proto/gen/opentelemetry/proto/trace/v1/trace_pb';
import { OtlpReceiver, type ReceivedSpan } from './support/otlp-receiver';
import { eventually } from '@infermesh/testing';
import { API_KEY, type Fixture, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

const { SERVER, INTERNAL } = Span_SpanKind;
/**
 * The spans of one request with a new input that runs alone in its batch, one per hop: gateway,
 * router, batcher, batch, worker, model run. The router does not ask the cache about an input it
 * certainly does not hold (its filter of the cache's keys lacks it), and the cache store after the
 * answer is not part of the trace.
 */
const SPANS_PER_REQUEST = 6;

/** A model that batches: requests arriving within 100 ms of each other share a batch. */
const BATCHED = {
  ...buildTinyModel(),
  name: 'tiny-batched',
  batching: { maxBatchSize: 16, maxQueueDelayUs: 100_000n },
};

const hex = (bytes: number) => randomBytes(bytes).toString('hex');

/**
 * Traces through the whole system, in the mesh with mutual TLS as `infermesh up` runs it, exported
 * as OTLP http/protobuf to the test's own receiver (which decodes them with the OTLP protos): one
 * request is one trace whose every hop's span has its parent in the trace; a batch span links to
 * every request it carries; a caller's sampling decision is followed.
 */
describe('traces of the request path (OTLP)', () => {
  const receiver = new OtlpReceiver();
  let fixture: Fixture;
  let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;

  beforeAll(async () => {
    await receiver.start();
    fixture = await startFixture({
      models: ['tiny', BATCHED],
      meshPolicyFile: join(REPO_ROOT, 'envoy', 'mesh.yaml'),
      mtls: {},
      env: {
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint,
        OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
        OTEL_TRACES_SAMPLER_ARG: '1',
        OTEL_BSP_SCHEDULE_DELAY: '100',
      },
    });
    grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress, { transport: null });
    // One request the caller does not sample (no span anywhere) opens every channel on the path first:
    // a cold router may skip the cache while its channel to it connects (mutual TLS over xDS), within
    // the lookup's 100 ms, and the traces below are about the path, not its first connections.
    const warm = await restInfer('tiny', `00-${hex(16)}-${hex(8)}-00`, 1_000);
    expect(warm.status).toBe(200);
    // And the router was told which keys the cache holds: new inputs are not looked up.
    await eventually(
      async () => (await metricValue(fixture.system.metricsUrl('router'), 'infermesh_router_cache_keys_known')) === 1,
      30_000,
    );
  }, 180_000);

  afterAll(async () => {
    grpc?.close();
    await fixture?.stop();
    await receiver.stop();
  });

  const restInfer = (model: string, traceparent: string | undefined, seed: number) =>
    fetch(`${fixture.system.gatewayUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${API_KEY}`,
        'content-type': 'application/json',
        ...(traceparent !== undefined && { traceparent }),
      },
      body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [seed, 1, 2, 3] }] }),
    });

  /** The spans of a trace once `count` of them have arrived (spans are exported in batches, by each service). */
  const traceOf = (traceId: string, count: number) =>
    receiver.waitFor((all) => {
      const trace = all.filter((s) => s.traceId === traceId);
      return trace.length >= count ? trace : undefined;
    }, 20_000);

  const one = (trace: ReceivedSpan[], service: string, name: string, kind: Span_SpanKind): ReceivedSpan => {
    const found = trace.filter((s) => s.service === service && s.name === name && s.kind === kind);
    if (found.length !== 1)
      throw new Error(
        `expected one ${service} span "${name}" (kind ${kind}), found ${found.length}: ${listSpans(trace)}`,
      );
    return found[0]!;
  };

  it("one REST request is one trace, from the caller's span through every hop to the model run", async () => {
    const traceId = hex(16);
    const callerSpan = hex(8);
    const response = await restInfer('tiny', `00-${traceId}-${callerSpan}-01`, 7);
    expect(response.status).toBe(200);

    const trace = await traceOf(traceId, SPANS_PER_REQUEST);
    const gateway = one(trace, 'gateway', 'POST /v2/models/:model/infer', SERVER);
    expect(gateway.parentSpanId).toBe(callerSpan);
    expect(gateway.attributes).toMatchObject({
      'http.route': '/v2/models/:model/infer',
      'http.response.status_code': 200,
      'infermesh.model': 'tiny',
      'infermesh.model.version': '1',
    });

    const router = one(trace, 'router', 'infermesh.router.v1.RouterService/Infer', SERVER);
    expect(router.parentSpanId).toBe(gateway.spanId);
    expect(router.attributes).toMatchObject({
      'rpc.system': 'grpc',
      'rpc.service': 'infermesh.router.v1.RouterService',
      'rpc.method': 'Infer',
      'rpc.grpc.status_code': 0,
    });
    expect(router.attributes).toMatchObject({
      'infermesh.model': 'tiny',
      'infermesh.model.version': '1',
      'infermesh.route': 'stable',
      'infermesh.cache': 'miss',
    });

    const batcher = one(trace, 'batcher', 'infermesh.batcher.v1.BatcherService/Infer', SERVER);
    expect(batcher.parentSpanId).toBe(router.spanId);
    expect(batcher.attributes['infermesh.batch.size']).toBe(1);
    expect(typeof batcher.attributes['infermesh.queue.wait_ms']).toBe('number');

    const batch = one(trace, 'batcher', 'batch tiny', INTERNAL);
    expect(batch.parentSpanId).toBe(batcher.spanId);
    expect(batch.attributes['infermesh.batch.id']).toBe(batcher.attributes['infermesh.batch.id']);
    expect(batch.links).toEqual([expect.objectContaining({ traceId, spanId: batcher.spanId })]);

    const worker = one(trace, 'worker', 'infermesh.worker.v1.WorkerService/Infer', SERVER);
    expect(worker.parentSpanId).toBe(batch.spanId);
    const run = one(trace, 'worker', 'onnxruntime run', INTERNAL);
    expect(run.parentSpanId).toBe(worker.spanId);
    expect(run.attributes).toMatchObject({
      'infermesh.model': 'tiny',
      'infermesh.model.version': '1',
      'infermesh.batch.size': 1,
      'infermesh.execution_provider': 'cpu',
    });
    expect(typeof run.attributes['infermesh.instance']).toBe('number');

    // The latency histograms carry the trace as an exemplar, to a scraper that asks for OpenMetrics.
    for (const [service, bucket, label] of [
      ['router', 'infermesh_router_grpc_server_handling_seconds_bucket{', 'method="RouterService/Infer"'],
      ['router', 'infermesh_router_request_duration_seconds_bucket{', 'model="tiny"'],
      ['gateway', 'infermesh_gateway_request_duration_seconds_bucket{', 'endpoint="POST /v2/models/:model/infer"'],
      ['batcher', 'infermesh_batcher_dispatch_duration_seconds_bucket{', 'model="tiny"'],
      ['worker', 'infermesh_worker_inference_compute_seconds_bucket{', 'model="tiny"'],
    ] as const) {
      const scraped = await fetch(fixture.system.metricsUrl(service), {
        headers: { accept: 'application/openmetrics-text;version=1.0.0,text/plain;q=0.5' },
      });
      expect(scraped.headers.get('content-type')).toContain('application/openmetrics-text');
      const exemplars = (await scraped.text())
        .split('\n')
        .filter((line) => line.startsWith(bucket) && line.includes(label) && line.includes(' # {'));
      expect({ bucket, exemplars }).toEqual({
        bucket,
        exemplars: expect.arrayContaining([expect.stringContaining(`trace_id="${traceId}"`)]),
      });
    }

    // Every span's parent is in the trace, but the gateway's, whose parent is the caller's; children end within their parents' traces.
    const ids = new Set(trace.map((s) => s.spanId));
    for (const span of trace) {
      if (span !== gateway)
        expect({ span: span.name, parentFound: ids.has(span.parentSpanId) }).toEqual({
          span: span.name,
          parentFound: true,
        });
      expect(span.endNs).toBeGreaterThanOrEqual(span.startNs);
      expect(span.status.code).not.toBe(Status_StatusCode.ERROR);
    }

    // The cache was not asked about the new input (its span would have come with the others by now).
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(receiver.spans.filter((s) => s.traceId === traceId && s.service === 'cache')).toEqual([]);

    // The same input again is asked about, and answered, by the cache: its lookup is a span of the trace.
    const again = hex(16);
    expect((await restInfer('tiny', `00-${again}-${hex(8)}-01`, 7)).status).toBe(200);
    const hit = await traceOf(again, 3);
    const hitRouter = one(hit, 'router', 'infermesh.router.v1.RouterService/Infer', SERVER);
    expect(hitRouter.attributes['infermesh.cache']).toBe('hit');
    expect(one(hit, 'cache', 'infermesh.cache.v1.CacheService/Lookup', SERVER).parentSpanId).toBe(hitRouter.spanId);
  }, 60_000);

  it('a gRPC request without trace context starts a trace at the gateway', async () => {
    const before = new Set(receiver.spans.map((s) => s.traceId));
    await grpc.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: 'tiny',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
        rawInputContents: [new Uint8Array(new Float32Array([11, 1, 2, 3]).buffer)],
      }),
      { metadata: { authorization: `Bearer ${API_KEY}` }, timeoutMs: 10_000 },
    );
    const root = await receiver.waitFor(
      (all) =>
        all.find(
          (s) =>
            !before.has(s.traceId) && s.service === 'gateway' && s.name === 'inference.GRPCInferenceService/ModelInfer',
        ),
      20_000,
    );
    expect(root.parentSpanId).toBe('');
    expect(root.kind).toBe(SERVER);
    const trace = await traceOf(root.traceId, SPANS_PER_REQUEST);
    expect(new Set(trace.map((s) => s.service))).toEqual(new Set(['gateway', 'router', 'batcher', 'worker']));
  }, 60_000);

  it('answers requests with malformed trace context, each starting a trace of its own', async () => {
    const hostile: Record<string, string>[] = [
      { traceparent: 'garbage' },
      { traceparent: `00-${'0'.repeat(32)}-${hex(8)}-01` }, // the invalid all-zero trace id
      { traceparent: `ff-${hex(16)}-${hex(8)}-01` }, // a version that may not be used
      { traceparent: `00-${hex(16)}-${hex(8)}-01`, tracestate: `a=${'x'.repeat(8_000)}` },
    ];
    const before = receiver.spans.length;
    for (const [i, headers] of hostile.entries()) {
      const response = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
        method: 'POST',
        headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json', ...headers },
        body: JSON.stringify({
          inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [300 + i, 1, 2, 3] }],
        }),
      });
      expect({ headers, status: response.status }).toEqual({ headers, status: 200 });
    }
    // Three new traces rooted at the gateway; the fourth continues its (well-formed) caller's trace.
    const roots = await receiver.waitFor((all) => {
      const found = all.slice(before).filter((s) => s.service === 'gateway' && s.kind === SERVER);
      return found.length === hostile.length ? found : undefined;
    }, 20_000);
    expect(roots.filter((s) => s.parentSpanId === '').length).toBe(3);
    expect(roots.every((s) => s.traceId !== '0'.repeat(32))).toBe(true);
  }, 60_000);

  it('a batch span links to the span of every request it carries, each of which records its batch', async () => {
    const traces = Array.from({ length: 6 }, () => hex(16));
    const responses = await Promise.all(
      traces.map((traceId, i) => restInfer(BATCHED.name, `00-${traceId}-${hex(8)}-01`, 100 + i)),
    );
    expect(responses.map((r) => r.status)).toEqual(traces.map(() => 200));

    const requestSpans = await receiver.waitFor((all) => {
      const found = all.filter((s) => traces.includes(s.traceId) && s.service === 'batcher' && s.kind === SERVER);
      return found.length === traces.length ? found : undefined;
    }, 20_000);
    const batchIds = new Set(requestSpans.map((s) => s.attributes['infermesh.batch.id']));
    // Sent together, within the 100 ms queue delay: fewer batches than requests.
    expect(batchIds.size).toBeLessThan(traces.length);
    for (const batchId of batchIds) {
      const members = requestSpans.filter((s) => s.attributes['infermesh.batch.id'] === batchId);
      const batch = await receiver.waitFor(
        (all) => all.find((s) => s.name === `batch ${BATCHED.name}` && s.attributes['infermesh.batch.id'] === batchId),
        20_000,
      );
      expect(batch.attributes['infermesh.batch.requests']).toBe(members.length);
      for (const member of members) expect(member.attributes['infermesh.batch.requests']).toBe(members.length);
      expect(sortLinks(batch.links)).toEqual(sortLinks(members.map((m) => ({ traceId: m.traceId, spanId: m.spanId }))));
      // The batch belongs to the trace of one of its requests, as a child of that request's span.
      expect(members.map((m) => m.spanId)).toContain(batch.parentSpanId);
    }
  }, 60_000);

  it("follows the caller's decision: a trace the caller does not sample is not exported", async () => {
    const unsampled = hex(16);
    const sampled = hex(16);
    expect((await restInfer('tiny', `00-${unsampled}-${hex(8)}-00`, 21)).status).toBe(200);
    expect((await restInfer('tiny', `00-${sampled}-${hex(8)}-01`, 22)).status).toBe(200);
    // The sampled one sent after it has arrived whole: the unsampled one would have by now.
    await traceOf(sampled, SPANS_PER_REQUEST);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(receiver.spans.filter((s) => s.traceId === unsampled)).toEqual([]);
  }, 60_000);
});

function sortLinks(links: readonly { traceId: string; spanId: string }[]): { traceId: string; spanId: string }[] {
  return links.map((l) => ({ traceId: l.traceId, spanId: l.spanId })).sort((a, b) => a.spanId.localeCompare(b.spanId));
}

function listSpans(trace: readonly ReceivedSpan[]): string {
  return trace.map((s) => `${s.service}:${s.name}(${s.kind})`).join(', ');
}
