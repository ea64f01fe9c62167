import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import {
  flushTracing,
  JsonLogger,
  Metrics,
  requestContext,
  spans,
  startTracing,
  stopTracing,
} from '@infermesh/telemetry';
import { SpanKind } from '@opentelemetry/api';
import { InMemorySpanExporter } from '@opentelemetry/sdk-trace';
import { createClient } from './grpc-client';
import { GrpcServer } from './grpc-server';
import { Errors } from './rpc-error';
import { HealthService, ServingStatus } from './health';
import type { CallContext, ServiceClient } from './method-types';

/** The spans go to the spec's in-memory exporter: the OTLP URL is not used. */
const UNUSED_URL = 'http://127.0.0.1:1/v1/traces';

/**
 * The spans libs/grpc makes, one per hop: the SERVER span of a call made for a sampled request is a
 * child of that request's span; a call made outside any traced request (a poll) makes none and sends
 * no trace context; only a public port starts traces of its own.
 */
const KEY = new Uint8Array(32);

describe('gRPC spans', () => {
  const exporter = new InMemorySpanExporter();
  const seen: CallContext[] = [];
  const servers: GrpcServer[] = [];
  const ports: number[] = [];
  let inner: ServiceClient<typeof CacheService>;
  let edge: ServiceClient<typeof CacheService>;

  async function serve(isPublic: boolean): Promise<ServiceClient<typeof CacheService>> {
    const server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: new Metrics('test'),
      maxMessageBytes: 1 << 20,
      public: isPublic,
    });
    server.add(
      CacheService,
      {
        lookup: async (request, ctx) => {
          seen.push(ctx);
          if (request.key.length === 0) throw new Error('boom');
          return { found: false };
        },
        store: async () => ({ stored: false }),
        watchKeys: async function* () {
          throw Errors.notImplemented('not a cache');
        },
      },
      { lookups: 'lookup', stores: 'store' },
    );
    const health = new HealthService();
    health.set('', ServingStatus.SERVING);
    server.add(Health, health);
    servers.push(server);
    const port = await server.listen('127.0.0.1', 0);
    ports.push(port);
    return createClient(CacheService, `127.0.0.1:${port}`, { transport: null });
  }

  /** The spans ended since the last call. */
  async function exported() {
    await flushTracing();
    const finished = exporter.getFinishedSpans();
    exporter.reset();
    return finished;
  }

  beforeAll(async () => {
    startTracing('test', 'test-1', { tracesUrl: UNUSED_URL, ratio: 1, parentBased: true }, exporter);
    inner = await serve(false);
    edge = await serve(true);
  });
  afterAll(async () => {
    inner.close();
    edge.close();
    await Promise.all(servers.map((s) => s.shutdown(100)));
    await stopTracing();
  });
  beforeEach(() => (seen.length = 0));

  it("makes the callee's span of a call made for a traced request a child of the request's span", async () => {
    const request = spans.server('request', {}, {}, true)!;
    await requestContext.run({ requestId: 'r1', span: request }, () => inner.lookup({ key: KEY }));
    spans.end(request);
    expect(seen[0]!.metadata['traceparent']).toBe(
      `00-${request.spanContext().traceId}-${request.spanContext().spanId}-01`,
    );
    const server = (await exported()).find((s) => s.name !== 'request')!;
    expect(server.kind).toBe(SpanKind.SERVER);
    expect(server.name).toBe('infermesh.cache.v1.CacheService/Lookup');
    expect(server.parentSpanContext?.spanId).toBe(request.spanContext().spanId);
    expect(server.attributes).toMatchObject({
      'rpc.system': 'grpc',
      'rpc.service': 'infermesh.cache.v1.CacheService',
      'rpc.method': 'Lookup',
      'rpc.grpc.status_code': 0,
    });
  });

  it('makes the same child span for a call carried on a stream, and none for one of an unsampled request', async () => {
    const carried = createClient(CacheService, `127.0.0.1:${ports[0]}`, {
      transport: null,
      carried: { lookup: 'lookups' },
    });
    try {
      const request = spans.server('request', {}, {}, true)!;
      await requestContext.run({ requestId: 'r1c', span: request }, () => carried.lookup({ key: KEY }));
      spans.end(request);
      const server = (await exported()).find((s) => s.name !== 'request')!;
      expect(server.name).toBe('infermesh.cache.v1.CacheService/Lookup');
      expect(server.parentSpanContext?.spanId).toBe(request.spanContext().spanId);
      expect(server.attributes).toMatchObject({ 'rpc.method': 'Lookup', 'rpc.grpc.status_code': 0 });
      expect(seen.at(-1)!.requestId).toBe('r1c');

      const unsampled = spans.server('edge', { traceparent: `00-${'1'.repeat(32)}-${'2'.repeat(16)}-00` }, {}, true)!;
      await requestContext.run({ requestId: 'r3c', span: unsampled }, () => carried.lookup({ key: KEY }));
      expect(await exported()).toEqual([]);
    } finally {
      carried.close();
    }
  });

  it("marks a failed call's span with its status", async () => {
    const request = spans.server('request', {}, {}, true)!;
    await expect(
      requestContext.run({ requestId: 'r2', span: request }, () => inner.lookup({ key: new Uint8Array() })),
    ).rejects.toThrow();
    spans.end(request);
    const server = (await exported()).find((s) => s.name !== 'request')!;
    expect([server.attributes['rpc.grpc.status_code'], server.status.code]).toEqual([13, 2]);
  });

  it('sends no trace context for a request that is not sampled', async () => {
    const unsampled = spans.server('edge', { traceparent: `00-${'1'.repeat(32)}-${'2'.repeat(16)}-00` }, {}, true)!;
    await requestContext.run({ requestId: 'r3', span: unsampled }, () => inner.lookup({ key: KEY }));
    expect(seen[0]!.metadata['traceparent']).toBeUndefined();
    expect(await exported()).toEqual([]);
  });

  it('makes no span and sends no trace context for a call outside any traced request', async () => {
    await requestContext.run({ requestId: 'poll' }, () => inner.lookup({ key: KEY }));
    await inner.lookup({ key: KEY });
    expect(seen.map((ctx) => ctx.metadata['traceparent'])).toEqual([undefined, undefined]);
    expect(await exported()).toEqual([]);
  });

  it('makes no span for a health check, even at a public port', async () => {
    const health = createClient(Health, `127.0.0.1:${ports[1]}`, { transport: null });
    await health.check({ service: '' });
    health.close();
    expect(await exported()).toEqual([]);
  });

  it('starts a trace at a public port for a caller that sends none', async () => {
    await edge.lookup({ key: KEY });
    const [root] = await exported();
    expect(root!.kind).toBe(SpanKind.SERVER);
    expect(root!.parentSpanContext).toBeUndefined();
  });
});
