import type { RunningService } from '@infermesh/runtime';
import { eventually } from '@infermesh/testing';
import { connect } from 'node:net';
import { RequestTracking } from './request-tracking.middleware';
import { type FakeUpstreams, http, metricsOf, startFakeUpstreams, startTestGateway } from '../testing/gateway-harness';

const KEY = 'send-timeout-spec-key-0123456789';
const SEND_TIMEOUT_MS = 300;
/** Elements of the echoed input: 16 MiB of answer, more than loopback's socket buffers hold. */
const ELEMENTS = 4 * 2 ** 20;
const INFER = '/v2/models/echo/infer';

/** A binary REST inference whose answer (the fake router echoes its input) is ELEMENTS FP32 values. */
function largeInference(): { headers: Record<string, string>; body: Buffer; raw: Buffer } {
  const json = JSON.stringify({
    inputs: [{ name: 'x', shape: [1, ELEMENTS], datatype: 'FP32', parameters: { binary_data_size: ELEMENTS * 4 } }],
    parameters: { binary_data_output: true },
  });
  const body = Buffer.concat([Buffer.from(json), Buffer.alloc(ELEMENTS * 4)]);
  const headers = {
    authorization: `Bearer ${KEY}`,
    'content-type': 'application/octet-stream',
    'inference-header-content-length': String(json.length),
  };
  const head = Object.entries({ host: 'x', ...headers, 'content-length': String(body.length) })
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join('');
  return { headers, body, raw: Buffer.concat([Buffer.from(`POST ${INFER} HTTP/1.1\r\n${head}\r\n`), body]) };
}

/**
 * A client that sends `request` and does not read what comes back until told to: then it reads to the
 * end of its connection, and resolves with how many bytes it got.
 */
function neverReads(port: number, request: Buffer): { readNow: () => Promise<number> } {
  let received = 0;
  const socket = connect(port, '127.0.0.1', () => {
    socket.write(request);
    socket.pause();
  });
  socket.on('data', (chunk: Buffer) => (received += chunk.length));
  socket.on('error', () => undefined);
  const closed = new Promise<number>((resolve) => socket.once('close', () => resolve(received)));
  return {
    readNow: () => {
      socket.resume();
      return closed;
    },
  };
}

const undelivered = (text: string) =>
  Number(/infermesh_gateway_http_undelivered_responses_total\{endpoint="POST [^"]+"\} (\d+)/.exec(text)?.[1] ?? 0);

describe(`${RequestTracking.name}: the REST send timeout`, () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;

  beforeAll(async () => {
    upstreams = await startFakeUpstreams(32 * 2 ** 20);
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, {
      GATEWAY_API_KEYS: KEY,
      GATEWAY_HTTP_SEND_TIMEOUT_MS: String(SEND_TIMEOUT_MS),
      GATEWAY_MAX_BODY_BYTES: String(20 * 2 ** 20),
      GATEWAY_MAX_MESSAGE_BYTES: String(20 * 2 ** 20),
      // Room for the bodies of two such requests at once, not three: the third below fits only once
      // the two held are let go.
      GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: String(2.5 * ELEMENTS * 4),
    });
  });

  afterAll(async () => {
    await gateway?.stop();
    await upstreams?.stop();
  });

  it('resets the connection of a client that never reads its response once overdue, counts it, and frees its body budget', async () => {
    const port = gateway.httpPort!;
    const inference = largeInference();
    const before = undelivered(await metricsOf(gateway));
    const started = Date.now();
    const clients = [neverReads(port, inference.raw), neverReads(port, inference.raw)];

    await eventually(async () => undelivered(await metricsOf(gateway)) - before === 2, 10_000);
    expect(Date.now() - started).toBeGreaterThanOrEqual(SEND_TIMEOUT_MS);
    // Their connections were reset: reading now, each gets the end of its connection before the end of its answer.
    for (const received of await Promise.all(clients.map((c) => c.readNow()))) {
      expect(received).toBeLessThan(ELEMENTS * 4);
    }
    // A reader of the same large response gets it whole: the timeout took only the clients that did not read.
    const read = await http(port, 'POST', INFER, { headers: inference.headers, body: inference.body });
    expect(read.status).toBe(200);
    expect(read.body.length).toBeGreaterThan(ELEMENTS * 4);
  });
});
