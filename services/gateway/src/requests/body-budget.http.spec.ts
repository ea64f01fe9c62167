import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import type { RunningService } from '@infermesh/runtime';
import { eventually, rpcRejection } from '@infermesh/testing';
import { request as httpRequest } from 'node:http';
import { BodyBudget } from './body-budget';
import { type FakeUpstreams, http, startFakeUpstreams, startTestGateway } from '../testing/gateway-harness';

const KEY = 'budget-spec-key-0123456789';
const AUTH = { authorization: `Bearer ${KEY}` };
const INFER = '/v2/models/mlp/infer';
// Room for two bodies of 4,000 bytes, not three.
const LIMITS = {
  GATEWAY_MAX_BODY_BYTES: '5000',
  GATEWAY_MAX_MESSAGE_BYTES: '9000',
  GATEWAY_MAX_BODY_BYTES_IN_FLIGHT: '9000',
};

/** A REST upload that announces `bytes` and sends only its headers until `finish` is called. */
function heldUpload(port: number, bytes: number) {
  const req = httpRequest({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: INFER,
    headers: { ...AUTH, 'content-length': String(bytes) },
  });
  const answered = new Promise<number>((resolve) => {
    req.on('response', (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', () => resolve(-1));
  });
  req.flushHeaders();
  return { answered, abort: () => req.destroy() };
}

describe(`${BodyBudget.name} in the gateway`, () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;
  let port: number;
  let client: ServiceClient<typeof GRPCInferenceService>;

  beforeAll(async () => {
    upstreams = await startFakeUpstreams();
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, {
      GATEWAY_API_KEYS: KEY,
      ...LIMITS,
    });
    port = gateway.httpPort!;
    client = createClient(GRPCInferenceService, `127.0.0.1:${gateway.grpcPort}`);
  });

  afterAll(async () => {
    client?.close();
    await gateway?.stop();
    await upstreams?.stop();
  });

  const budget = () => gateway.app.get(BodyBudget);

  it('refuses REST and gRPC requests that do not fit beside the bodies being received, naming the limit, and takes them again once those end', async () => {
    const first = heldUpload(port, 4_000);
    const second = heldUpload(port, 4_000);
    await eventually(() => budget().bytesInFlight === 8_000);

    const refused = await http(port, 'POST', INFER, { headers: AUTH, body: Buffer.alloc(2_000, 0x20) });
    expect(refused.status).toBe(429);
    expect(refused.headers['retry-after']).toBe('1');
    expect(refused.json).toEqual({ error: expect.stringContaining('GATEWAY_MAX_BODY_BYTES_IN_FLIGHT') });
    const grpcRequest = create(ModelInferRequestSchema, {
      modelName: 'mlp',
      inputs: [{ name: 'x', datatype: 'FP32', shape: [1n, 500n] }],
      rawInputContents: [new Uint8Array(2_000)],
    });
    const grpcRefusal = await rpcRejection(client.modelInfer(grpcRequest, { metadata: AUTH }));
    expect(grpcRefusal.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(grpcRefusal.message).toContain('GATEWAY_MAX_BODY_BYTES_IN_FLIGHT');
    expect(grpcRefusal.retryDelayMs).toBeGreaterThan(0);

    first.abort();
    second.abort();
    await eventually(() => budget().bytesInFlight === 0);
    const served = await client.modelInfer(grpcRequest, { metadata: AUTH });
    expect(served.modelName).toBe('mlp');
    expect(budget().bytesInFlight).toBe(0);
  });
});

describe('REST bodies that do not arrive', () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;
  let port: number;

  beforeAll(async () => {
    upstreams = await startFakeUpstreams();
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, {
      GATEWAY_API_KEYS: KEY,
      GATEWAY_CONCURRENCY_LIMIT: 'fixed',
      GATEWAY_MAX_IN_FLIGHT: '4',
      GATEWAY_HTTP_RECEIVE_TIMEOUT_MS: '400',
    });
    port = gateway.httpPort!;
  });

  afterAll(async () => {
    await gateway?.stop();
    await upstreams?.stop();
  });

  it('take no place under the concurrency limit while they are awaited, and are refused 408 once overdue', async () => {
    // More requests than the limit has places, each sending its headers and never its body.
    const held = Array.from({ length: 6 }, () => heldUpload(port, 1_000));
    await eventually(() => gateway.app.get(BodyBudget).bytesInFlight === 6_000);

    const served = await http(port, 'POST', INFER, {
      headers: AUTH,
      body: JSON.stringify({ inputs: [{ name: 'x', datatype: 'FP32', shape: [1, 2], data: [1, 2] }] }),
    });
    expect(served.status).toBe(200);

    expect(await Promise.all(held.map((h) => h.answered))).toEqual(new Array(6).fill(408));
    expect(gateway.app.get(BodyBudget).bytesInFlight).toBe(0);
  });
});
