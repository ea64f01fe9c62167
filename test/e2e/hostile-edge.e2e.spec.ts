import { create, type MessageInitShape, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { createClient, toServiceDefinition } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { buildIdentityModel } from '@infermesh/model-builder';
import { SERVICE_NAMES, type ServiceName } from '@infermesh/system';
import { connect as connectTcp } from 'node:net';
import { request as httpRequest } from 'node:http';
import { connect as connectHttp2, constants as http2Constants } from 'node:http2';
import { API_KEY, type Fixture, metricValue, startFixture } from './support/system-fixture';

const float32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);
const TINY_INPUT = { name: 'input', shape: [1, 4], datatype: 'FP32', data: [1, 2, 3, 4] };
const AUTH = { authorization: `Bearer ${API_KEY}` };
/** Names far beyond any limit: the size that tore down the gateway's connection to the router. */
const HUGE_NAME = 'n'.repeat(58_000);
/** The body budget the gateway runs with here: room for one 60 MB upload at a time. */
const BODY_BUDGET_BYTES = 96 * 2 ** 20;
const UPLOAD_BYTES = 60_000_000;
/** How long the gateway waits here for a gRPC call's message once its headers have come. */
const RECEIVE_TIMEOUT_MS = 2_000;
/** The most inference requests the gateway lets in flight here (its adaptive limit's ceiling): (14) opens more idle requests than that. */
const MAX_IN_FLIGHT = 256;
/** Calls, all connections together, the gateway holds here while their message has not come: above (9)'s 4 × 1,024. */
const AWAITING_LIMIT = 6_000;
/** How long the gateway waits here for a gRPC call's answer or a REST response to leave once it has begun. */
const SEND_TIMEOUT_MS = 2_000;
/** Elements of the identity model's input and answer in (11): 16 MiB each way, more than loopback's socket buffers hold. */
const IDENTITY_ELEMENTS = 4 * 2 ** 20;

type InferInit = MessageInitShape<typeof ModelInferRequestSchema>;

/**
 * A KServe gRPC call made with grpc-js directly, so that the deadline reaches the gateway as the
 * client gave it (infermesh's own client bounds deadlines before they leave).
 */
function rawGrpc(address: string) {
  const Ctor = grpc.makeGenericClientConstructor(toServiceDefinition(GRPCInferenceService), 'GRPCInferenceService');
  const client = new Ctor(address, grpc.credentials.createInsecure());
  const infer = (
    request: InferInit,
    deadline: number,
  ): Promise<{ code: grpc.status; details: string; outputs: number }> =>
    new Promise((resolve) => {
      const metadata = new grpc.Metadata();
      metadata.set('authorization', AUTH.authorization);
      const options = Number.isFinite(deadline) ? { deadline } : {};
      (client as unknown as Record<string, (...args: unknown[]) => void>)['modelInfer']!.call(
        client,
        request,
        metadata,
        options,
        (error: grpc.ServiceError | null, response: { outputs?: unknown[] } | undefined) =>
          resolve(
            error
              ? { code: error.code, details: error.details, outputs: 0 }
              : { code: grpc.status.OK, details: '', outputs: response?.outputs?.length ?? 0 },
          ),
      );
    });
  return { infer, close: () => client.close() };
}

const tinyGrpc = (parameters: InferInit['parameters'] = {}, inputName = 'input'): InferInit => ({
  modelName: 'tiny',
  inputs: [{ name: inputName, datatype: 'FP32', shape: [1n, 4n] }],
  rawInputContents: [float32([1, 2, 3, 4])],
  parameters,
});

/**
 * Hostile requests at the edge while well-behaved clients keep sending valid ones: huge or nonsense
 * timeouts and deadlines, oversized names, many large uploads at once, the registry gone. No process
 * dies, no well-behaved request is lost, bad input gets a 4xx naming the problem, memory comes back.
 * Then a flood beyond the gateway's concurrency limit, answered or refused call by call.
 */
describe('hostile requests at the edge', () => {
  let fixture: Fixture;
  let pids: Map<ServiceName, number | undefined>;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny', buildIdentityModel(['FP32'], 'identity')],
      env: {
        GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: String(BODY_BUDGET_BYTES),
        GATEWAY_MAX_REQUEST_TIMEOUT_MS: '600000',
        GATEWAY_MAX_NAME_BYTES: '1024',
        GATEWAY_GRPC_RECEIVE_TIMEOUT_MS: String(RECEIVE_TIMEOUT_MS),
        GATEWAY_GRPC_MAX_CALLS_AWAITING_REQUEST: String(AWAITING_LIMIT),
        GATEWAY_HTTP_RECEIVE_TIMEOUT_MS: String(RECEIVE_TIMEOUT_MS),
        GATEWAY_MAX_IN_FLIGHT: String(MAX_IN_FLIGHT),
        GATEWAY_GRPC_SEND_TIMEOUT_MS: String(SEND_TIMEOUT_MS),
        GATEWAY_HTTP_SEND_TIMEOUT_MS: String(SEND_TIMEOUT_MS),
      },
    });
    pids = new Map(SERVICE_NAMES.map((name) => [name, fixture.system.process(name).pid]));
  });

  afterAll(async () => {
    await fixture?.stop();
  });

  const url = (path: string) => `${fixture.system.gatewayUrl}${path}`;
  const post = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(url(path), {
      method: 'POST',
      headers: { ...AUTH, 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
      signal: AbortSignal.timeout(60_000),
    });
    const text = await res.text();
    return { status: res.status, text };
  };

  /** Services that died or were replaced since the start (but one the test killed itself). */
  const deadServices = () =>
    SERVICE_NAMES.filter(
      (name) =>
        pids.has(name) &&
        (!fixture.system.process(name).running || fixture.system.process(name).pid !== pids.get(name)),
    );

  /**
   * `clients` loops of valid requests (half REST, half gRPC) until stopped; each counts what it sent
   * and every request that did not succeed.
   */
  const wellBehaved = (clients: number) => {
    let running = true;
    const failures: string[] = [];
    let sent = 0;
    const grpcClient = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    const loops = Array.from({ length: clients }, async (_, i) => {
      while (running) {
        sent += 1;
        try {
          if (i % 2 === 0) {
            const { status, text } = await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT] });
            if (status !== 200) failures.push(`REST ${status} ${text.slice(0, 200)}`);
          } else {
            const response = await grpcClient.modelInfer(
              create(GRPCInferenceService.method.modelInfer.input, tinyGrpc()),
              {
                metadata: AUTH,
                timeoutMs: 60_000,
              },
            );
            if (response.rawOutputContents.length !== 1) failures.push('gRPC: no output');
          }
        } catch (error) {
          failures.push(
            `${i % 2 === 0 ? 'REST' : 'gRPC'}: ${error instanceof Error ? error.message.slice(0, 200) : String(error)}`,
          );
          await new Promise((r) => setTimeout(r, 100)); // a dead gateway refuses at once: no busy loop
        }
        if (failures.length >= 1_000) break;
      }
    });
    return {
      stop: async () => {
        running = false;
        await Promise.all(loops);
        grpcClient.close();
        return { sent, failures };
      },
    };
  };

  /** Runs `hostile` while 16 well-behaved clients run, then checks they lost nothing and every process lives. */
  const underLoad = async <T>(hostile: () => Promise<T>): Promise<T> => {
    const good = wellBehaved(16);
    await new Promise((r) => setTimeout(r, 300));
    let result: T;
    let outcome: { sent: number; failures: string[] };
    try {
      result = await hostile();
      await new Promise((r) => setTimeout(r, 300));
    } finally {
      outcome = await good.stop();
    }
    const { sent, failures } = outcome;
    process.stdout.write(`well-behaved clients: ${sent} requests sent, ${failures.length} failed\n`);
    expect({ dead: deadServices(), failures: failures.slice(0, 10), failed: failures.length }).toEqual({
      dead: [],
      failures: [],
      failed: 0,
    });
    expect(sent).toBeGreaterThan(8);
    return result;
  };

  /**
   * `streams` gRPC calls on each of `connections` new connections to the gateway, each with its
   * headers (and a valid key) and never a message; their answers counted by grpc-status.
   */
  const neverSentCalls = (connections: number, streams: number) => {
    const sessions = Array.from({ length: connections }, () =>
      connectHttp2(`http://${fixture.system.gatewayGrpcAddress}`),
    );
    const statuses = new Map<string, number>();
    let answered = 0;
    for (const session of sessions) {
      session.on('error', () => undefined);
      for (let i = 0; i < streams; i++) {
        const stream = session.request(
          {
            ':method': 'POST',
            ':path': '/inference.GRPCInferenceService/ModelInfer',
            'content-type': 'application/grpc',
            te: 'trailers',
            ...AUTH,
          },
          { endStream: false },
        );
        stream.on('error', () => undefined);
        stream.on('response', (headers) => {
          const code = String(headers['grpc-status'] ?? 'none');
          statuses.set(code, (statuses.get(code) ?? 0) + 1);
          answered += 1;
        });
        stream.resume();
      }
    }
    return {
      sessions,
      statuses,
      answered: () => answered,
      close: () => sessions.forEach((session) => session.destroy()),
    };
  };

  it('(1, 7) clamps huge timeouts and deadlines, refuses nonsense ones naming them, and stays up', async () => {
    const raw = rawGrpc(fixture.system.gatewayGrpcAddress);
    const DAY_MS = 24 * 3600 * 1000;
    try {
      const outcome = await underLoad(async () => {
        const rest = {
          hugeTimeout: await post('/v2/models/tiny/infer', {
            inputs: [TINY_INPUT],
            parameters: { timeout: 400000000000000000 },
          }),
          negativeTimeout: await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], parameters: { timeout: -5 } }),
          fractionalTimeout: await post('/v2/models/tiny/infer', {
            inputs: [TINY_INPUT],
            parameters: { timeout: 1.5 },
          }),
          textTimeout: await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], parameters: { timeout: 'soon' } }),
          negativePriority: await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], parameters: { priority: -1 } }),
          textPriority: await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], parameters: { priority: 'high' } }),
          maxHeader: await post(
            '/v2/models/tiny/infer',
            { inputs: [TINY_INPUT] },
            { 'x-request-timeout-ms': '2147483647' },
          ),
          hugeHeader: await post(
            '/v2/models/tiny/infer',
            { inputs: [TINY_INPUT] },
            { 'x-request-timeout-ms': '99999999999999999999' },
          ),
          negativeHeader: await post(
            '/v2/models/tiny/infer',
            { inputs: [TINY_INPUT] },
            { 'x-request-timeout-ms': '-1' },
          ),
        };
        const grpcCalls = {
          hugeTimeoutNoDeadline: await raw.infer(
            tinyGrpc({ timeout: { parameterChoice: { case: 'int64Param', value: 400000000000000000n } } }),
            Infinity,
          ),
          negativeTimeout: await raw.infer(
            tinyGrpc({ timeout: { parameterChoice: { case: 'int64Param', value: -1n } } }),
            Date.now() + 60_000,
          ),
          deadline25Days: await raw.infer(tinyGrpc(), Date.now() + 25 * DAY_MS),
          deadline30Days: await raw.infer(tinyGrpc(), Date.now() + 30 * DAY_MS),
          deadline50Days: await raw.infer(tinyGrpc(), Date.now() + 50 * DAY_MS),
          deadline10Years: await raw.infer(tinyGrpc(), Date.now() + 3650 * DAY_MS),
        };
        return { rest, grpcCalls };
      });

      const { rest, grpcCalls } = outcome;
      // Too long: clamped to GATEWAY_MAX_REQUEST_TIMEOUT_MS, and served.
      expect([rest.hugeTimeout.status, rest.maxHeader.status, rest.hugeHeader.status]).toEqual([200, 200, 200]);
      // Nonsense: 400 naming what is wrong.
      for (const [which, parameter] of [
        ['negativeTimeout', 'timeout'],
        ['fractionalTimeout', 'timeout'],
        ['textTimeout', 'timeout'],
        ['negativePriority', 'priority'],
        ['textPriority', 'priority'],
        ['negativeHeader', 'x-request-timeout-ms'],
      ] as const) {
        expect({ which, status: rest[which].status }).toEqual({ which, status: 400 });
        expect(rest[which].text).toContain(parameter);
      }
      expect(grpcCalls.hugeTimeoutNoDeadline).toEqual({ code: grpc.status.OK, details: '', outputs: 1 });
      expect(grpcCalls.deadline25Days).toEqual({ code: grpc.status.OK, details: '', outputs: 1 });
      expect(grpcCalls.deadline30Days).toEqual({ code: grpc.status.OK, details: '', outputs: 1 });
      expect(grpcCalls.deadline50Days).toEqual({ code: grpc.status.OK, details: '', outputs: 1 });
      expect(grpcCalls.deadline10Years).toEqual({ code: grpc.status.OK, details: '', outputs: 1 });
      expect(grpcCalls.negativeTimeout.code).toBe(grpc.status.INVALID_ARGUMENT);
      expect(grpcCalls.negativeTimeout.details).toContain('timeout');
    } finally {
      raw.close();
    }
  });

  it('(3) refuses oversized names with a short 400 naming the limit, and other callers lose nothing', async () => {
    const raw = rawGrpc(fixture.system.gatewayGrpcAddress);
    try {
      const answers = await underLoad(async () => {
        const all: { what: string; status: number | string; text: string }[] = [];
        // All at once, as a burst of such requests would come; five rounds.
        for (let round = 0; round < 5; round += 1) {
          const requests: [string, Promise<{ status: number; text: string }>][] = [
            ['input name', post('/v2/models/tiny/infer', { inputs: [{ ...TINY_INPUT, name: HUGE_NAME }] })],
            ['input name', post('/v2/models/tiny/infer', { inputs: [{ ...TINY_INPUT, name: HUGE_NAME.repeat(10) }] })],
            ['output name', post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], outputs: [{ name: HUGE_NAME }] })],
            ['parameter key', post('/v2/models/tiny/infer', { inputs: [TINY_INPUT], parameters: { [HUGE_NAME]: 1 } })],
            [
              'input parameter key',
              post('/v2/models/tiny/infer', { inputs: [{ ...TINY_INPUT, parameters: { [HUGE_NAME]: true } }] }),
            ],
            ['request id', post('/v2/models/tiny/infer', { id: HUGE_NAME, inputs: [TINY_INPUT] })],
            ['model name', post(`/v2/models/${'m'.repeat(6_000)}/infer`, { inputs: [TINY_INPUT] })],
            ['version', post(`/v2/models/tiny/versions/${'v'.repeat(6_000)}/infer`, { inputs: [TINY_INPUT] })],
          ];
          const grpcPending = raw.infer(tinyGrpc({}, HUGE_NAME), Date.now() + 60_000);
          for (const [what, pending] of requests) all.push({ what, ...(await pending) });
          const grpcAnswer = await grpcPending;
          all.push({
            what: 'gRPC input name',
            status: grpc.status[grpcAnswer.code] ?? String(grpcAnswer.code),
            text: grpcAnswer.details,
          });
        }
        return all;
      });
      for (const answer of answers) {
        const expected = answer.what === 'gRPC input name' ? 'INVALID_ARGUMENT' : 400;
        expect({ what: answer.what, status: answer.status }).toEqual({ what: answer.what, status: expected });
        expect(answer.text).toContain('GATEWAY_MAX_NAME_BYTES');
        expect(answer.text.length).toBeLessThan(1_000);
      }
    } finally {
      raw.close();
    }
  });

  it('(4) bounds the request bodies held at once, and gateway memory comes back after large uploads', async () => {
    const metricsUrl = fixture.system.metricsUrl('gateway');
    const rss = () => metricValue(metricsUrl, 'process_resident_memory_bytes', { service: 'gateway' });
    const baseline = await rss();
    const chunk = Buffer.alloc(1_000_000, 0x61); // "aaaa…": not JSON, refused once read
    let peak = baseline;
    const uploads = await underLoad(async () => {
      let held = 0; // uploads that have sent all but their last chunk
      const release: (() => void)[] = [];
      const one = () =>
        new Promise<{ status: number | undefined; text: string; error?: string }>((resolve) => {
          let answered: { status: number; text: string } | undefined;
          const req = httpRequest(url('/v2/models/tiny/infer'), {
            method: 'POST',
            headers: { ...AUTH, 'content-type': 'application/json', 'content-length': String(UPLOAD_BYTES) },
          });
          req.on('response', (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => (text += d));
            res.on('end', () => {
              answered = { status: res.statusCode ?? 0, text };
              resolve(answered);
            });
          });
          req.on('error', (error) => {
            if (answered === undefined) resolve({ status: undefined, text: '', error: error.message });
          });
          req.flushHeaders();
          // Slowly: a chunk at a time, the last one only once every upload has sent the rest.
          void (async () => {
            await new Promise((r) => setTimeout(r, 500));
            for (
              let sent = 0;
              sent < UPLOAD_BYTES - chunk.length && answered === undefined && !req.destroyed;
              sent += chunk.length
            ) {
              if (!req.write(chunk)) await new Promise((r) => req.once('drain', r).once('close', r));
              await new Promise((r) => setTimeout(r, 5));
            }
            held += 1;
            await new Promise<void>((r) => release.push(r));
            if (answered === undefined && !req.destroyed) req.end(chunk);
          })();
        });
      const pending = Array.from({ length: 12 }, one);
      const deadline = Date.now() + 120_000;
      while (held < 12 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 200));
        peak = Math.max(peak, await rss());
      }
      peak = Math.max(peak, await rss());
      for (const r of release) r();
      return Promise.all(pending);
    });
    // Settled: what the uploads took is given back (the garbage collector may take its time: up to 30 s).
    // Three times the budget: the one body it admitted, its text for the parser, and what the heap keeps a while.
    const BOUND_BYTES = 3 * BODY_BUDGET_BYTES;
    let after = await rss();
    for (let i = 0; i < 30 && after - baseline >= BOUND_BYTES; i += 1) {
      await new Promise((r) => setTimeout(r, 1_000));
      after = await rss();
    }
    process.stdout.write(
      `gateway RSS: ${Math.round(baseline / 2 ** 20)} MiB before, ${Math.round(peak / 2 ** 20)} MiB peak, ${Math.round(after / 2 ** 20)} MiB after 12 uploads of 60 MB\n`,
    );
    const statuses = uploads.map((u) => u.status ?? u.error);
    // None is a 5xx but the budget's refusal; those refused say which limit and when to retry.
    const refused = uploads.filter((u) => u.status === 429);
    expect(refused.length).toBeGreaterThan(0);
    for (const u of refused) expect(u.text).toContain('GATEWAY_MAX_BODY_BYTES_IN_FLIGHT');
    expect(statuses.filter((s) => typeof s === 'number' && s >= 500)).toEqual([]);
    // The budget holds one 60 MB body at a time (12 at once would be 720 MB), and it comes back.
    expect(peak - baseline).toBeLessThan(400 * 2 ** 20);
    expect(after - baseline).toBeLessThan(BOUND_BYTES);
    expect(await metricValue(metricsUrl, 'infermesh_gateway_request_body_bytes_in_flight')).toBe(0);
  });

  it('(6) stays ready while the registry is down and inference works, and says the registry is disconnected', async () => {
    const readiness: number[] = [];
    const grpcReady: boolean[] = [];
    let details: Record<string, unknown> = {};
    const inference = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    try {
      await underLoad(async () => {
        await fixture.system.process('registry').kill();
        pids.delete('registry');
        // Past the readiness probe's cache and timeout: the gateway has seen the registry gone.
        const until = Date.now() + 4_000;
        while (Date.now() < until) {
          const res = await fetch(url('/v2/health/ready'), { signal: AbortSignal.timeout(30_000) });
          readiness.push(res.status);
          grpcReady.push((await inference.serverReady({}, { timeoutMs: 30_000 })).ready);
          await new Promise((r) => setTimeout(r, 250));
        }
        const health = await fetch(fixture.system.metricsUrl('gateway').replace('/metrics', '/health'));
        details = (await health.json()) as Record<string, unknown>;
      });
    } finally {
      inference.close();
      await fixture.system.restart('registry');
      pids.set('registry', fixture.system.process('registry').pid);
    }
    expect(readiness.length).toBeGreaterThan(5);
    expect(readiness.filter((s) => s !== 200)).toEqual([]);
    expect(grpcReady.filter((r) => !r)).toEqual([]);
    expect(details['upstreams']).toMatchObject({ router: { serving: true }, registry: { serving: false } });
  });

  it('(8) sheds a flood beyond its concurrency limit: every call answered, with an answer or OVERLOADED and a retry delay, and counted', async () => {
    const metrics = fixture.system.metricsUrl('gateway');
    const overloadedBefore = await metricValue(metrics, 'infermesh_gateway_inference_requests_total', {
      outcome: 'overloaded',
    });
    const raw = rawGrpc(fixture.system.gatewayGrpcAddress);
    let grpcAnswers: { code: grpc.status; details: string; outputs: number }[];
    let restAnswers: { status: number; retryAfter: string | null; text: string }[];
    try {
      // Far more at once than the gateway's adaptive limit (128 at start, MAX_IN_FLIGHT at most) lets in.
      const grpcFlood = Array.from({ length: 3_000 }, () => raw.infer(tinyGrpc(), Date.now() + 60_000));
      const restFlood = Array.from({ length: 400 }, async () => {
        const res = await fetch(url('/v2/models/tiny/infer'), {
          method: 'POST',
          headers: { ...AUTH, 'content-type': 'application/json' },
          body: JSON.stringify({ inputs: [TINY_INPUT] }),
          signal: AbortSignal.timeout(60_000),
        });
        return { status: res.status, retryAfter: res.headers.get('retry-after'), text: await res.text() };
      });
      [grpcAnswers, restAnswers] = await Promise.all([Promise.all(grpcFlood), Promise.all(restFlood)]);
    } finally {
      raw.close();
    }
    const grpcRefused = grpcAnswers.filter((a) => a.code === grpc.status.RESOURCE_EXHAUSTED);
    const restRefused = restAnswers.filter((a) => a.status === 429);
    process.stdout.write(
      `flood: gRPC ${grpcAnswers.length - grpcRefused.length} answered, ${grpcRefused.length} refused; REST ${restAnswers.length - restRefused.length} answered, ${restRefused.length} refused\n`,
    );
    // Nothing but answers and refusals, every refusal saying why and when to retry.
    expect(grpcAnswers.filter((a) => a.code !== grpc.status.OK && a.code !== grpc.status.RESOURCE_EXHAUSTED)).toEqual(
      [],
    );
    expect(grpcAnswers.filter((a) => a.code === grpc.status.OK && a.outputs !== 1)).toEqual([]);
    expect(grpcRefused.filter((a) => !a.details.includes('inference requests in flight'))).toEqual([]);
    expect(restAnswers.filter((a) => a.status !== 200 && a.status !== 429)).toEqual([]);
    expect(restRefused.filter((a) => a.retryAfter !== '1' || !a.text.includes('inference requests in flight'))).toEqual(
      [],
    );
    expect(grpcRefused.length).toBeGreaterThan(0);
    expect(grpcAnswers.length - grpcRefused.length).toBeGreaterThan(0);
    // Each refusal counted once, as outcome overloaded; nothing left in flight; the limit within its bounds.
    const overloaded =
      (await metricValue(metrics, 'infermesh_gateway_inference_requests_total', { outcome: 'overloaded' })) -
      overloadedBefore;
    expect(overloaded).toBe(grpcRefused.length + restRefused.length);
    expect(await metricValue(metrics, 'infermesh_gateway_inference_in_flight')).toBe(0);
    const limit = await metricValue(metrics, 'infermesh_gateway_concurrency_limit');
    expect(limit).toBeGreaterThanOrEqual(16);
    expect(limit).toBeLessThanOrEqual(MAX_IN_FLIGHT);
    // Once the flood is over, requests pass again.
    const after = await post('/v2/models/tiny/infer', { inputs: [TINY_INPUT] });
    expect(after.status).toBe(200);
  });

  it('(9) holds gRPC calls opened and never sent only until their message is overdue, and only as many per connection as it announces', async () => {
    const metricsUrl = fixture.system.metricsUrl('gateway');
    const rss = () => metricValue(metricsUrl, 'process_resident_memory_bytes', { service: 'gateway' });
    const baseline = await rss();
    const CONNECTIONS = 4;
    const STREAMS = 3_000;
    // Before these bounds, each such call stayed open for as long as its connection (100,000 on one
    // connection: 510 MiB more gateway memory, and a well-behaved request stalled for 7 s).
    const result = await underLoad(async () => {
      const calls = neverSentCalls(CONNECTIONS, STREAMS);
      const settings = await Promise.all(
        calls.sessions.map(
          (session) =>
            new Promise<{ maxConcurrentStreams?: number }>((resolve) => session.once('remoteSettings', resolve)),
        ),
      );
      let peak = baseline;
      // The first wave, as many per connection as the gateway lets one hold, is answered once overdue.
      const deadline = Date.now() + 10 * RECEIVE_TIMEOUT_MS;
      while (calls.answered() < CONNECTIONS * 1_024 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 250));
        peak = Math.max(peak, await rss());
      }
      calls.close();
      return { settings, statuses: calls.statuses, answered: calls.answered(), peak };
    });
    process.stdout.write(
      `never-sent calls: ${result.answered} answered (${JSON.stringify(Object.fromEntries(result.statuses))}); gateway RSS ${Math.round(baseline / 2 ** 20)} MiB before, ${Math.round(result.peak / 2 ** 20)} MiB peak\n`,
    );
    expect(result.settings.map((s) => s.maxConcurrentStreams)).toEqual(new Array(CONNECTIONS).fill(1_024));
    expect(result.answered).toBeGreaterThanOrEqual(CONNECTIONS * 1_024);
    expect([...result.statuses.keys()]).toEqual([String(grpc.status.DEADLINE_EXCEEDED)]);
  });

  it('(13) holds only so many never-sent gRPC calls across many connections: past the limit the one waiting longest goes, at once', async () => {
    const metricsUrl = fixture.system.metricsUrl('gateway');
    const awaiting = () => metricValue(metricsUrl, 'infermesh_gateway_grpc_server_calls_awaiting_request');
    const evictions = () => metricValue(metricsUrl, 'infermesh_gateway_grpc_server_requests_evicted_total');
    const evictedBefore = await evictions();
    const CONNECTIONS = 24;
    const STREAMS = 1_000;
    // Before this limit, the gateway held every such call until it was overdue, whatever the number of
    // connections: 600 connections' calls (a flood from another process, 25,000 calls a second) took
    // 1.9 GiB more gateway memory in 20 s, and grew on.
    const result = await underLoad(async () => {
      const calls = neverSentCalls(CONNECTIONS, STREAMS);
      let peak = 0;
      const deadline = Date.now() + 10 * RECEIVE_TIMEOUT_MS;
      while (calls.answered() < CONNECTIONS * STREAMS && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        peak = Math.max(peak, await awaiting());
      }
      calls.close();
      return { statuses: calls.statuses, answered: calls.answered(), peak };
    });
    const evicted = (await evictions()) - evictedBefore;
    process.stdout.write(
      `never-sent calls on ${CONNECTIONS} connections: ${result.answered} answered (${JSON.stringify(Object.fromEntries(result.statuses))}); at most ${result.peak} held at once; ${evicted} evicted\n`,
    );
    expect(result.answered).toBe(CONNECTIONS * STREAMS);
    expect(result.peak).toBeLessThanOrEqual(AWAITING_LIMIT);
    // The calls past the limit went at once, the last AWAITING_LIMIT once overdue.
    const exhausted = result.statuses.get(String(grpc.status.RESOURCE_EXHAUSTED)) ?? 0;
    expect(exhausted).toBeGreaterThanOrEqual(CONNECTIONS * STREAMS - AWAITING_LIMIT);
    expect(exhausted + (result.statuses.get(String(grpc.status.DEADLINE_EXCEEDED)) ?? 0)).toBe(CONNECTIONS * STREAMS);
    expect(evicted).toBe(exhausted);
    expect(await awaiting()).toBe(0);
  }, 120_000);

  it('(14) lets REST requests whose body never comes take no place under the concurrency limit, and answers them 408 once overdue', async () => {
    // Before, a REST inference request took its place under the limit with its headers: as many
    // connections as the limit allows, each sending a request's headers and never its body, had
    // every other inference request, REST and gRPC, refused (429) for as long as Node let a request
    // take (5 minutes).
    const CONNECTIONS = MAX_IN_FLIGHT + 44;
    const { hostname, port } = new URL(fixture.system.gatewayUrl);
    const answers = await underLoad(async () => {
      const held = Array.from(
        { length: CONNECTIONS },
        () =>
          new Promise<string>((resolve) => {
            const socket = connectTcp(Number(port), hostname);
            let received = '';
            socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
            socket.on('error', () => undefined);
            socket.on('close', () => resolve(received));
            socket.write(
              `POST /v2/models/tiny/infer HTTP/1.1\r\nHost: ${hostname}\r\nAuthorization: ${AUTH.authorization}\r\n` +
                'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n',
            );
          }),
      );
      // The well-behaved clients run while every held request waits for its body, and after.
      await new Promise((r) => setTimeout(r, RECEIVE_TIMEOUT_MS / 2));
      return Promise.all(held);
    });
    const statuses = answers.map((text) => /^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 'none');
    process.stdout.write(
      `REST requests without a body on ${CONNECTIONS} connections: ${JSON.stringify(statuses.reduce<Record<string, number>>((t, s) => ({ ...t, [s]: (t[s] ?? 0) + 1 }), {}))}\n`,
    );
    expect(statuses).toEqual(new Array(CONNECTIONS).fill('408'));
    expect(answers[0]).toContain(
      `the request body did not arrive whole within ${RECEIVE_TIMEOUT_MS} ms (GATEWAY_HTTP_RECEIVE_TIMEOUT_MS)`,
    );
    expect(await metricValue(fixture.system.metricsUrl('gateway'), 'infermesh_gateway_inference_in_flight')).toBe(0);
  }, 60_000);

  it('(10) drops the answers of gRPC calls whose client never reads them once they are overdue: every such call closed, none held open', async () => {
    const metricsUrl = fixture.system.metricsUrl('gateway');
    const dropped = () =>
      metricValue(metricsUrl, 'infermesh_gateway_grpc_server_undelivered_answers_total', {
        method: 'GRPCInferenceService/ModelInfer',
      }).catch(() => 0);
    const droppedBefore = await dropped();
    const CONNECTIONS = 4;
    const CALLS = 300;
    // Whole, valid calls from clients whose HTTP/2 window is 0: the gateway may send them headers,
    // never a byte of an answer. Before this bound each such call stayed open, its answer and its
    // memory held, for as long as its connection (4 × 1,000 such calls: 161 MiB more gateway memory).
    // One gRPC message (a flag byte, its length, the encoded request), sent whole by every call.
    const encoded = toBinary(ModelInferRequestSchema, create(ModelInferRequestSchema, tinyGrpc()));
    const frame = Buffer.alloc(5 + encoded.length);
    frame.writeUInt32BE(encoded.length, 1);
    frame.set(encoded, 5);
    const result = await underLoad(async () => {
      const sessions = Array.from({ length: CONNECTIONS }, () =>
        connectHttp2(`http://${fixture.system.gatewayGrpcAddress}`, { settings: { initialWindowSize: 0 } }),
      );
      const outcomes = new Map<string, number>();
      let closed = 0;
      for (const session of sessions) {
        session.on('error', () => undefined);
        for (let i = 0; i < CALLS; i++) {
          // Paced (200 calls/s), a load the gateway admits beside the well-behaved clients': not a flood.
          if (i % 10 === 9) await new Promise((r) => setTimeout(r, 50));
          const stream = session.request({
            ':method': 'POST',
            ':path': '/inference.GRPCInferenceService/ModelInfer',
            'content-type': 'application/grpc',
            te: 'trailers',
            ...AUTH,
          });
          let status = 'none';
          stream.on('error', () => undefined);
          stream.on('response', (headers) => (status = String(headers['grpc-status'] ?? 'answer begun')));
          stream.on('close', () => {
            const outcome =
              stream.rstCode === http2Constants.NGHTTP2_CANCEL ? 'reset (CANCEL)' : `grpc-status ${status}`;
            outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
            closed += 1;
          });
          stream.end(frame);
          stream.pause();
        }
      }
      const deadline = Date.now() + 10 * SEND_TIMEOUT_MS;
      while (closed < CONNECTIONS * CALLS && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 250));
      }
      for (const session of sessions) session.destroy();
      return { outcomes, closed };
    });
    const resets = result.outcomes.get('reset (CANCEL)') ?? 0;
    process.stdout.write(
      `unread answers: ${result.closed} of ${CONNECTIONS * CALLS} calls closed (${JSON.stringify(Object.fromEntries(result.outcomes))})\n`,
    );
    expect(result.closed).toBe(CONNECTIONS * CALLS);
    // Every call was either refused at once (the gateway's concurrency limit) or answered and then dropped.
    expect([...result.outcomes.keys()].filter((k) => k !== 'reset (CANCEL)' && k !== 'grpc-status 8')).toEqual([]);
    expect(resets).toBeGreaterThan(CALLS);
    expect((await dropped()) - droppedBefore).toBe(resets);
  });

  it('(11) resets the connections of REST clients that never read their responses once overdue, and their body budget comes back', async () => {
    const metricsUrl = fixture.system.metricsUrl('gateway');
    const dropped = () => metricValue(metricsUrl, 'infermesh_gateway_http_undelivered_responses_total').catch(() => 0);
    const bodyBytesHeld = () => metricValue(metricsUrl, 'infermesh_gateway_request_body_bytes_in_flight');
    const droppedBefore = await dropped();
    const CONNECTIONS = 4;
    // A binary inference of the identity model: a 16 MiB answer for 16 MiB sent, asked for as raw bytes.
    const json = JSON.stringify({
      inputs: [
        {
          name: 'fp32_in',
          shape: [1, IDENTITY_ELEMENTS],
          datatype: 'FP32',
          parameters: { binary_data_size: IDENTITY_ELEMENTS * 4 },
        },
      ],
      parameters: { binary_data_output: true },
    });
    const body = Buffer.concat([Buffer.from(json), Buffer.alloc(IDENTITY_ELEMENTS * 4)]);
    const head =
      `POST /v2/models/identity/infer HTTP/1.1\r\nhost: gateway\r\nauthorization: ${AUTH.authorization}\r\n` +
      `content-type: application/octet-stream\r\ninference-header-content-length: ${json.length}\r\n` +
      `content-length: ${body.length}\r\n\r\n`;
    const request = Buffer.concat([Buffer.from(head), body]);
    const result = await underLoad(async () => {
      // Whole, valid requests from clients that never read a byte of what comes back. Before this
      // bound each held its answer in the gateway, and its body's share of the budget, for as long as
      // it kept its connection (8 such clients: 394 MiB more gateway memory, still held 35 s later).
      const sockets = Array.from({ length: CONNECTIONS }, () => {
        const socket = connectTcp(Number(new URL(fixture.system.gatewayUrl).port), '127.0.0.1', () => {
          socket.write(request);
          socket.pause();
        });
        socket.on('error', () => undefined);
        return socket;
      });
      const deadline = Date.now() + 10 * SEND_TIMEOUT_MS;
      while ((await dropped()) - droppedBefore < CONNECTIONS && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 250));
      }
      const held = await bodyBytesHeld();
      // Reading now, each client finds its connection ended before its answer did.
      const received = await Promise.all(
        sockets.map(
          (socket) =>
            new Promise<number>((resolve) => {
              let bytes = 0;
              socket.on('data', (chunk: Buffer) => (bytes += chunk.length));
              socket.once('close', () => resolve(bytes));
              socket.resume();
            }),
        ),
      );
      return { dropped: (await dropped()) - droppedBefore, held, received };
    });
    process.stdout.write(
      `unread responses: ${result.dropped} of ${CONNECTIONS} dropped; bytes each client got: ${result.received.join(', ')}; body bytes held afterwards: ${result.held}\n`,
    );
    expect(result.dropped).toBe(CONNECTIONS);
    for (const bytes of result.received) expect(bytes).toBeLessThan(IDENTITY_ELEMENTS * 4);
    // Their request bodies no longer count against the budget (the well-behaved clients' may).
    expect(result.held).toBeLessThan(IDENTITY_ELEMENTS * 4);
  });

  it('(12) keeps the connection of a gRPC client that gives up on thousands of its calls: every call it waited for answered', async () => {
    // grpc-js resets the stream of each call whose deadline passes. Node's HTTP/2 server takes more
    // than 1,000 resets (then 33 a second) for the rapid-reset attack unless told otherwise, and
    // closes the connection under every call on it.
    const raw = rawGrpc(fixture.system.gatewayGrpcAddress);
    const kept: Promise<{ code: grpc.status; details: string; outputs: number }>[] = [];
    const givenUp: Promise<{ code: grpc.status; details: string; outputs: number }>[] = [];
    try {
      await underLoad(async () => {
        // 4,000 calls in 4 s on one connection; three of four with a deadline shorter than an answer takes.
        for (let tick = 0; tick < 200; tick++) {
          for (let i = 0; i < 20; i++) {
            if (i % 4 === 0) kept.push(raw.infer(tinyGrpc(), Date.now() + 60_000));
            else givenUp.push(raw.infer(tinyGrpc(), Date.now() + 2));
          }
          await new Promise((r) => setTimeout(r, 20));
        }
        await Promise.all([...kept, ...givenUp]);
      });
    } finally {
      raw.close();
    }
    const tally = (answers: { code: grpc.status }[]) =>
      answers.reduce<Record<string, number>>(
        (t, a) => ({ ...t, [grpc.status[a.code]]: (t[grpc.status[a.code]] ?? 0) + 1 }),
        {},
      );
    const keptAnswers = await Promise.all(kept);
    const givenUpAnswers = await Promise.all(givenUp);
    process.stdout.write(
      `calls given up: ${JSON.stringify(tally(givenUpAnswers))}; calls waited for: ${JSON.stringify(tally(keptAnswers))}\n`,
    );
    // Those waited for: answered, or refused by the concurrency limit; none lost with a connection.
    expect(keptAnswers.filter((a) => a.code !== grpc.status.OK && a.code !== grpc.status.RESOURCE_EXHAUSTED)).toEqual(
      [],
    );
    expect(givenUpAnswers.filter((a) => a.code === grpc.status.DEADLINE_EXCEEDED).length).toBeGreaterThan(2_000);
  }, 120_000);

  it('keeps every process alive through all of it', () => {
    expect(deadServices()).toEqual([]);
  });
});
