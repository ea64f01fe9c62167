import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import {
  ExportTraceServiceRequestSchema,
  ExportTraceServiceResponseSchema,
} from '@infermesh/proto/gen/opentelemetry/proto/collector/trace/v1/trace_service_pb';
import type { AnyValue, KeyValue } from '@infermesh/proto/gen/opentelemetry/proto/common/v1/common_pb';
import type { Span_SpanKind, Status_StatusCode } from '@infermesh/proto/gen/opentelemetry/proto/trace/v1/trace_pb';
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gunzipSync } from 'node:zlib';

const EMPTY_RESPONSE = toBinary(ExportTraceServiceResponseSchema, create(ExportTraceServiceResponseSchema));

/**
 * The spans in an ExportTraceServiceRequest, counted on the wire without decoding them: the
 * request's resource_spans (field 1), their scope_spans (field 2), their spans (field 2).
 */
export function countSpans(body: Uint8Array): number {
  const within = (bytes: Uint8Array, field: number, each: (value: Uint8Array) => void) => {
    const reader = new BinaryReader(bytes);
    while (reader.pos < reader.len) {
      const [number, type] = reader.tag();
      if (number === field && type === WireType.LengthDelimited) each(reader.bytes());
      else reader.skip(type);
    }
  };
  let spans = 0;
  within(body, 1, (resourceSpans) =>
    within(resourceSpans, 2, (scopeSpans) => within(scopeSpans, 2, () => (spans += 1))),
  );
  return spans;
}

/** Largest export body accepted, before and after gunzip; a bigger one is answered 413. */
const MAX_BODY_BYTES = 64 * 1024 * 1024;
const WAIT_POLL_MS = 20;

/** An attribute value as OTLP carries it, with 64-bit integers as numbers (exact up to 2^53). */
export type AttributeValue =
  string | number | boolean | Uint8Array | null | AttributeValue[] | { [key: string]: AttributeValue };

/** One span as a test reads it: ids as lowercase hex, the resource's service name copied in. */
export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span. */
  parentSpanId: string;
  name: string;
  kind: Span_SpanKind;
  /** The `service.name` of the resource that sent it, '' when it had none. */
  service: string;
  attributes: Record<string, AttributeValue>;
  events: { name: string; attributes: Record<string, AttributeValue> }[];
  links: { traceId: string; spanId: string; attributes: Record<string, AttributeValue> }[];
  status: { code: Status_StatusCode; message: string };
  startNs: bigint;
  endNs: bigint;
}

/**
 * An OTLP/HTTP trace receiver (`POST /v1/traces`, binary protobuf, optionally gzipped) on a free
 * loopback port, standing in for an OpenTelemetry collector so that tests can see the spans the
 * services export. With `keep: false` it only counts spans, so that a benchmark's receiver holds no
 * memory however long it runs.
 */
export class OtlpReceiver {
  private readonly server: Server;
  private readonly kept: ReceivedSpan[] = [];
  private received = 0;
  private accepted = 0;
  private refused = 0;
  private port: number | undefined;

  constructor(private readonly options: { keep?: boolean } = {}) {
    this.server = createServer((request, response) => {
      this.handle(request, response).catch((error: unknown) =>
        reply(response, 500, `receiver failed: ${String(error)}`),
      );
    });
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(0, '127.0.0.1', () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** The base URL exporters are pointed at (OTEL_EXPORTER_OTLP_ENDPOINT); spans go to `${endpoint}/v1/traces`. */
  get endpoint(): string {
    if (this.port === undefined) throw new Error('the OTLP receiver is not started');
    return `http://127.0.0.1:${this.port}`;
  }

  /** The spans received since the last clear(), in arrival order; always empty with `keep: false`. */
  get spans(): readonly ReceivedSpan[] {
    return this.kept;
  }

  /** Spans received since the last clear(), whether kept or not. */
  get spanCount(): number {
    return this.received;
  }

  /** Export requests decoded and answered 200 since the last clear(). */
  get exports(): number {
    return this.accepted;
  }

  /** Requests answered with an error (wrong path, method, type, or a body that does not decode) since the last clear(). */
  get rejected(): number {
    return this.refused;
  }

  /** Forgets every span and count, so that a test sees only what comes after. */
  clear(): void {
    this.kept.length = 0;
    this.received = 0;
    this.accepted = 0;
    this.refused = 0;
  }

  /**
   * Polls the kept spans until `predicate` returns something other than undefined and returns that;
   * exporters batch, so spans arrive a while after the work that made them.
   */
  async waitFor<T>(predicate: (spans: readonly ReceivedSpan[]) => T | undefined, timeoutMs: number): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const result = predicate(this.kept);
      if (result !== undefined) return result;
      if (Date.now() >= deadline) {
        throw new Error(
          `the spans awaited did not arrive within ${timeoutMs} ms (${this.received} spans in ${this.accepted} exports so far)`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, WAIT_POLL_MS));
    }
  }

  async stop(): Promise<void> {
    // Exporters keep connections alive; close them, or close() would wait for them to time out.
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await closed;
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const path = (request.url ?? '').split('?')[0];
    if (path !== '/v1/traces')
      return this.refuse(response, 404, `no such endpoint ${path ?? ''}; OTLP traces go to POST /v1/traces`);
    if (request.method !== 'POST')
      return this.refuse(response, 405, `${request.method ?? ''} is not allowed; OTLP traces are sent with POST`, {
        allow: 'POST',
      });
    const type = (request.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/x-protobuf') {
      return this.refuse(
        response,
        415,
        `content-type ${type || '(none)'} is not supported; send OTLP as application/x-protobuf`,
      );
    }
    const encoding = (request.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
    if (encoding !== 'identity' && encoding !== 'gzip') {
      return this.refuse(response, 415, `content-encoding ${encoding} is not supported; send identity or gzip`);
    }

    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of request as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > MAX_BODY_BYTES)
        return this.refuse(response, 413, `export body over ${MAX_BODY_BYTES} bytes`, { connection: 'close' });
      chunks.push(chunk);
    }
    let body: Buffer;
    try {
      body =
        encoding === 'gzip'
          ? gunzipSync(Buffer.concat(chunks), { maxOutputLength: MAX_BODY_BYTES })
          : Buffer.concat(chunks);
    } catch (error) {
      return this.refuse(
        response,
        400,
        `gzip body does not decompress within ${MAX_BODY_BYTES} bytes: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    if (this.options.keep === false) {
      // Counted without decoding: a benchmark's receiver must cost next to nothing.
      let count: number;
      try {
        count = countSpans(body);
      } catch (error) {
        return this.refuse(
          response,
          400,
          `body is not an ExportTraceServiceRequest: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
      this.accepted += 1;
      this.received += count;
      response.writeHead(200, { 'content-type': 'application/x-protobuf' });
      response.end(EMPTY_RESPONSE);
      return;
    }
    let export_;
    try {
      export_ = fromBinary(ExportTraceServiceRequestSchema, body);
    } catch (error) {
      return this.refuse(
        response,
        400,
        `body is not an ExportTraceServiceRequest: ${error instanceof Error ? error.message : String(error)}`,
      );
    }

    this.accepted += 1;
    for (const resourceSpans of export_.resourceSpans) {
      const resource = attributes(resourceSpans.resource?.attributes ?? []);
      const service = typeof resource['service.name'] === 'string' ? resource['service.name'] : '';
      for (const scopeSpans of resourceSpans.scopeSpans) {
        this.received += scopeSpans.spans.length;
        for (const span of scopeSpans.spans) {
          this.kept.push({
            traceId: hex(span.traceId),
            spanId: hex(span.spanId),
            parentSpanId: hex(span.parentSpanId),
            name: span.name,
            kind: span.kind,
            service,
            attributes: attributes(span.attributes),
            events: span.events.map((event) => ({ name: event.name, attributes: attributes(event.attributes) })),
            links: span.links.map((link) => ({
              traceId: hex(link.traceId),
              spanId: hex(link.spanId),
              attributes: attributes(link.attributes),
            })),
            status: { code: span.status?.code ?? 0, message: span.status?.message ?? '' },
            startNs: span.startTimeUnixNano,
            endNs: span.endTimeUnixNano,
          });
        }
      }
    }
    response.writeHead(200, { 'content-type': 'application/x-protobuf' });
    response.end(EMPTY_RESPONSE);
  }

  private refuse(response: ServerResponse, status: number, reason: string, headers: Record<string, string> = {}): void {
    this.refused += 1;
    reply(response, status, reason, headers);
  }
}

function reply(response: ServerResponse, status: number, reason: string, headers: Record<string, string> = {}): void {
  if (response.headersSent) {
    response.destroy();
    return;
  }
  response.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', ...headers });
  response.end(`${reason}\n`);
}

function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
}

function attributes(list: readonly KeyValue[]): Record<string, AttributeValue> {
  return Object.fromEntries(list.map((kv) => [kv.key, value(kv.value)]));
}

function value(any: AnyValue | undefined): AttributeValue {
  const v = any?.value;
  switch (v?.case) {
    case undefined:
      return null;
    case 'stringValue':
    case 'boolValue':
    case 'doubleValue':
    case 'bytesValue':
      return v.value;
    case 'intValue':
      return Number(v.value);
    case 'arrayValue':
      return v.value.values.map(value);
    case 'kvlistValue':
      return attributes(v.value.values);
  }
}
