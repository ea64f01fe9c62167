import { performance } from 'node:perf_hooks';
import {
  type ClientHttp2Session,
  type ClientHttp2Stream,
  connect,
  constants as http2Constants,
  type IncomingHttpHeaders,
} from 'node:http2';
import { create, toBinary } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { FLOW_CONTROL_WINDOW_BYTES, methodPath } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { API_KEY } from '../../e2e/support/system-fixture';

export const INFER_PATH = methodPath(GRPCInferenceService.method.modelInfer);
export const SERVER_LIVE_PATH = methodPath(GRPCInferenceService.method.serverLive);

/**
 * A call a LoadClient made that did not end OK: its gRPC status code and message, as grpc-js's
 * ServiceError has them, and the HTTP/2 code its stream was reset with where it ended without a status.
 */
export class CallFailed extends Error {
  constructor(
    readonly code: status,
    readonly details: string,
    readonly rstCode?: number,
  ) {
    super(`${status[code] ?? code}: ${details}`);
  }
}

/**
 * A stream that closed without a gRPC status, as a failed call. One the server reset with
 * ENHANCE_YOUR_CALM, the code Node's HTTP/2 server refuses a stream with when a connection already
 * has as many open as it allows, is RESOURCE_EXHAUSTED, as the gRPC protocol maps that code and
 * grpc-js answers it: the server refused the call. Any other (a connection closed, a stream reset
 * otherwise) is UNAVAILABLE.
 */
function streamFailure(rstCode: number | undefined): CallFailed {
  return rstCode === http2Constants.NGHTTP2_ENHANCE_YOUR_CALM
    ? new CallFailed(status.RESOURCE_EXHAUSTED, 'the server refused the stream (HTTP/2 ENHANCE_YOUR_CALM)', rstCode)
    : new CallFailed(status.UNAVAILABLE, `the stream closed without a status (HTTP/2 code ${rstCode})`, rstCode);
}

/**
 * The session memory (MB) the client lets a connection take, as grpc-js's client does (its
 * `grpc-node.max_session_memory` default). Node's default, 10 MB, is reached by a few thousand calls
 * in flight on one connection; past it Node's client resets each new stream itself, with
 * ENHANCE_YOUR_CALM, and a server's rapid-reset guard (Node's default: 1,000 resets, then 33 a
 * second; the services': STREAM_RESETS_ALLOWED) closes the connection under every call on it.
 * Measured: 8,000 calls a second for 5 s through the batching benchmark's system, on one
 * connection, lost 21,750 and 24,689 of 40,000 calls so (INTERNAL_ERROR resets), in two runs.
 */
const UNBOUNDED_SESSION_MEMORY_MB = Number.MAX_SAFE_INTEGER;

/** The gRPC message prefix: a byte saying uncompressed, then the message's length (big-endian). */
const MESSAGE_PREFIX_BYTES = 5;

/**
 * The benchmarks' gRPC client: unary calls on one HTTP/2 connection of its own (node:http2), the
 * request's bytes framed as they are, the answer's bytes not decoded, the connection's and each
 * stream's receive window opened as the services' clients open theirs (FLOW_CONTROL_WINDOW_BYTES).
 *
 * It is not grpc-js's client because that one cost the load more than the system could spare: at
 * the batching benchmark's 2× overload (11,000 calls/s from one process) grpc-js's client took
 * 800-850 ms of CPU a second of this machine's two cores, and this one 330-360 (an ad hoc run of the
 * overload alone, the two alternated); what the clients take, the services measured lack.
 * The services' own clients stay grpc-js, as do the floor's hops (path.scenario.ts).
 *
 * A connection that closes (GOAWAY, a reset, the server gone) fails the calls on it UNAVAILABLE,
 * and the next call opens another.
 */
export class LoadClient {
  private session: ClientHttp2Session | undefined;

  constructor(private readonly address: string) {}

  /** One unary call of `path` with `message`, answered within `timeoutMs` or failed DEADLINE_EXCEEDED; resolves with the answer's message bytes. */
  call(path: string, message: Buffer, timeoutMs: number, headers: Record<string, string> = {}): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const framed = Buffer.allocUnsafe(MESSAGE_PREFIX_BYTES + message.length);
      framed[0] = 0;
      framed.writeUInt32BE(message.length, 1);
      message.copy(framed, MESSAGE_PREFIX_BYTES);
      let stream: ClientHttp2Stream;
      try {
        stream = this.connection().request({
          ':method': 'POST',
          ':path': path,
          'content-type': 'application/grpc',
          te: 'trailers',
          'grpc-timeout': `${timeoutMs}m`,
          ...headers,
        });
      } catch (error) {
        reject(new CallFailed(status.UNAVAILABLE, error instanceof Error ? error.message : String(error)));
        return;
      }
      let code: status | undefined;
      let details = '';
      let timedOut = false;
      const chunks: Buffer[] = [];
      const ended = (fields: IncomingHttpHeaders) => {
        const statusField = fields['grpc-status'];
        if (typeof statusField !== 'string') return;
        code = Number(statusField);
        const message = fields['grpc-message'];
        details = typeof message === 'string' ? decodeURIComponent(message) : '';
      };
      stream.on('response', ended); // a trailers-only answer (an error) has its status in its headers
      stream.on('trailers', ended);
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.on('error', () => undefined); // the close below answers the call
      stream.setTimeout(timeoutMs, () => {
        timedOut = true;
        stream.close(http2Constants.NGHTTP2_CANCEL);
      });
      stream.on('close', () => {
        if (code === status.OK) {
          const answer = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
          if (
            answer.length >= MESSAGE_PREFIX_BYTES &&
            answer[0] === 0 &&
            answer.readUInt32BE(1) === answer.length - MESSAGE_PREFIX_BYTES
          )
            resolve(answer.subarray(MESSAGE_PREFIX_BYTES));
          else
            reject(
              new CallFailed(
                status.INTERNAL,
                `the answer is not one uncompressed gRPC message (${answer.length} bytes)`,
              ),
            );
        } else if (code !== undefined) reject(new CallFailed(code, details));
        else if (timedOut) reject(new CallFailed(status.DEADLINE_EXCEEDED, `no answer within ${timeoutMs} ms`));
        else reject(streamFailure(stream.rstCode));
      });
      stream.end(framed);
    });
  }

  close(): void {
    this.session?.close();
    this.session = undefined;
  }

  private connection(): ClientHttp2Session {
    if (this.session === undefined || this.session.closed || this.session.destroyed) {
      const session = connect(`http://${this.address}`, {
        settings: { initialWindowSize: FLOW_CONTROL_WINDOW_BYTES },
        maxSessionMemory: UNBOUNDED_SESSION_MEMORY_MB,
      });
      session.once('remoteSettings', () => {
        if (!session.destroyed) session.setLocalWindowSize(FLOW_CONTROL_WINDOW_BYTES);
      });
      session.on('error', () => undefined); // its streams close, failing their calls
      this.session = session;
    }
    return this.session;
  }
}

/**
 * A seed as two input elements, each exact as a float32: its low 16 bits and the rest. A float32
 * holds every integer only up to 2^24, and the benchmarks' seeds go far above it.
 */
export function seedElements(seed: number): [number, number] {
  return [seed % 65_536, Math.floor(seed / 65_536)];
}

/**
 * Encoded ModelInferRequests of one item of `model`, its input all ones but the first two elements,
 * which hold the seed (seedElements): a request of its own for each seed (a copy of one encoding with
 * the seed written in), so that no cache answers one.
 */
export function seededRequests(model: string, item: readonly number[]): (seed: number) => Buffer {
  const data = new Float32Array(item.reduce((a, b) => a * b, 1)).fill(1);
  const template = Buffer.from(
    toBinary(
      ModelInferRequestSchema,
      create(ModelInferRequestSchema, {
        modelName: model,
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, ...item.map(BigInt)] }],
        rawInputContents: [new Uint8Array(data.buffer)],
      }),
    ),
  );
  const dataOffset = template.length - data.byteLength; // raw_input_contents is the request's last field
  return (seed) => {
    const bytes = Buffer.from(template);
    const [low, high] = seedElements(seed);
    bytes.writeFloatLE(low, dataOffset);
    bytes.writeFloatLE(high, dataOffset + 4);
    return bytes;
  };
}

/** A ModelInfer call with the request's bytes as they are, and the caller's key. Fails with CallFailed. */
export function unary(client: LoadClient, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  return client.call(INFER_PATH, bytes, timeoutMs, { authorization: `Bearer ${API_KEY}` });
}

/** A ServerLive call (it does nothing); resolves when answered, whatever the answer. */
export function serverLive(client: LoadClient): Promise<void> {
  return client.call(SERVER_LIVE_PATH, Buffer.alloc(0), 30_000).then(
    () => undefined,
    () => undefined,
  );
}

/** A ServerLive call on `client` every `everyMs` until stopped; stop() gives the latencies (ms) of those answered. */
export function serverLiveEvery(client: LoadClient, everyMs: number): { stop(): number[] } {
  const latencies: number[] = [];
  const timer = setInterval(() => {
    const t = performance.now();
    void serverLive(client).then(() => latencies.push(performance.now() - t));
  }, everyMs);
  return {
    stop: () => {
      clearInterval(timer);
      return latencies;
    },
  };
}
