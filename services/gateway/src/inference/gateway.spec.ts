import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient, ServingStatus } from '@infermesh/grpc';
import {
  GRPCInferenceService,
  type ModelInferRequest,
  ModelInferRequestSchema,
} from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import type { RunningService } from '@infermesh/runtime';
import { eventually, freePort, ManualClock, rpcRejection } from '@infermesh/testing';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import type { GatewayOptions } from '../gateway.module';
import { GatewayGrpcController } from './gateway.grpc';
import { GatewayHttpController } from './gateway.http';
import {
  catchUpWithWallClock,
  type FakeRouter,
  fakeRegistry,
  fakeRouter,
  http,
  postJson as postJsonAs,
  startTestGateway as startHarnessGateway,
  startUpstream,
  type Upstream,
} from '../testing/gateway-harness';

const KEY = 'gateway-spec-key-0123456789';
const AUTH = { authorization: `Bearer ${KEY}` };
const MAX_BODY_BYTES = 4096;

async function startTestGateway(
  routerAddress: string,
  registryAddress: string,
  env: Record<string, string> = {},
  options: GatewayOptions = {},
): Promise<RunningService> {
  return startHarnessGateway(
    routerAddress,
    registryAddress,
    {
      GATEWAY_API_KEYS: `other-key-abcdefghijkl, ${KEY}`,
      GATEWAY_MAX_BODY_BYTES: String(MAX_BODY_BYTES),
      ...env,
    },
    options,
  );
}

const postJson = (port: number, path: string, body: unknown, headers: Record<string, string> = AUTH) =>
  postJsonAs(port, path, body, headers);

const f32 = (values: number[]) => Buffer.from(Float32Array.from(values).buffer);

describe('gateway', () => {
  const routerState: FakeRouter = { requests: [] };
  let router: Upstream;
  let registry: Upstream;
  let gateway: RunningService;
  let port: number;
  let grpcClient: ServiceClient<typeof GRPCInferenceService>;
  // The gateway's time: it stands still during each test, at the wall clock's time when the test starts.
  const clock = new ManualClock(Date.now());

  beforeAll(async () => {
    router = await startUpstream(
      (s) => s.add(RouterService, fakeRouter(routerState), { infers: 'infer' }),
      'infermesh.router.v1.RouterService',
    );
    registry = await startUpstream(
      (s) => s.add(RegistryService, fakeRegistry()),
      'infermesh.registry.v1.RegistryService',
    );
    gateway = await startTestGateway(router.address, registry.address, {}, { clock });
    port = gateway.httpPort!;
    grpcClient = createClient(GRPCInferenceService, `127.0.0.1:${gateway.grpcPort}`);
  });

  beforeEach(() => catchUpWithWallClock(clock));

  afterAll(async () => {
    grpcClient?.close();
    await gateway?.stop();
    await router?.stop();
    await registry?.stop();
  });

  describe(GatewayHttpController.name, () => {
    it('answers health without a key and everything else only with one', async () => {
      expect((await http(port, 'GET', '/v2/health/live')).status).toBe(200);
      expect((await http(port, 'GET', '/v2/health/ready')).json).toEqual({ ready: true });
      for (const headers of [
        {} as Record<string, string>,
        { authorization: 'Bearer wrong-key' },
        { authorization: `Basic ${KEY}` },
        { authorization: KEY },
      ]) {
        const reply = await http(port, 'GET', '/v2/models/mlp', { headers });
        expect(reply.status).toBe(401);
        expect(reply.json).toEqual({ error: expect.any(String) });
        expect(reply.text).not.toContain(KEY);
        expect(reply.headers['www-authenticate']).toBe('Bearer');
      }
      const unauthorizedInfer = await postJson(port, '/v2/models/mlp/infer', { inputs: [] }, {});
      expect(unauthorizedInfer.status).toBe(401);
      expect((await http(port, 'GET', '/v2/models/mlp', { headers: { authorization: `bearer ${KEY}` } })).status).toBe(
        200,
      );
      expect(
        (await http(port, 'GET', '/v2/models/mlp', { headers: { authorization: 'Bearer other-key-abcdefghijkl' } }))
          .status,
      ).toBe(200);
    });

    it('is ready only while its router reports SERVING, whatever the registry says, probing again once its answer is stale', async () => {
      const cacheMs = gateway.app.get<GatewayConfig>(GATEWAY_CONFIG).upstreamProbeCacheMs;
      clock.advance(cacheMs); // past any earlier probe's answer
      expect((await http(port, 'GET', '/v2/health/ready')).status).toBe(200);
      router.health.set('', ServingStatus.NOT_SERVING);
      // Within the cache the last probe's answer stands.
      clock.advance(cacheMs - 1);
      expect((await http(port, 'GET', '/v2/health/ready')).status).toBe(200);
      clock.advance(1);
      expect((await http(port, 'GET', '/v2/health/ready')).status).toBe(503);
      expect(await grpcClient.serverReady({})).toMatchObject({ ready: false });
      router.health.set('', ServingStatus.SERVING);
      registry.health.set('', ServingStatus.NOT_SERVING);
      clock.advance(cacheMs);
      expect((await http(port, 'GET', '/v2/health/ready')).status).toBe(200);
      expect(await grpcClient.serverReady({})).toMatchObject({ ready: true });
      registry.health.set('', ServingStatus.SERVING);
    });

    it('describes the server', async () => {
      const reply = await http(port, 'GET', '/v2', { headers: AUTH });
      expect(reply.status).toBe(200);
      expect(reply.json).toEqual({
        name: 'infermesh',
        version: expect.any(String),
        extensions: expect.arrayContaining(['model_repository']),
      });
    });

    it('describes a model by its latest READY version and a version by itself', async () => {
      const latest = await http(port, 'GET', '/v2/models/mlp', { headers: AUTH });
      expect(latest.status).toBe(200);
      expect(latest.json).toEqual({
        name: 'mlp',
        versions: ['2', '3'],
        platform: 'onnxruntime_onnx',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
        outputs: [{ name: 'output', datatype: 'INT64', shape: [-1] }],
      });
      const v3 = await http(port, 'GET', '/v2/models/mlp/versions/3', { headers: AUTH });
      expect((v3.json as { inputs: unknown[] }).inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, 6] }]);
      const unknownVersion = await http(port, 'GET', '/v2/models/mlp/versions/9', { headers: AUTH });
      expect(unknownVersion.status).toBe(404);
      expect((unknownVersion.json as { error: string }).error).toContain('9');
      const unknownModel = await http(port, 'GET', '/v2/models/nope', { headers: AUTH });
      expect(unknownModel.status).toBe(404);
      expect(unknownModel.json).toEqual({ error: expect.stringContaining('nope') });
    });

    it('says whether a model or a version is ready: 200, 503 when not, 404 when unknown', async () => {
      expect((await http(port, 'GET', '/v2/models/mlp/ready', { headers: AUTH })).status).toBe(200);
      expect((await http(port, 'GET', '/v2/models/mlp/versions/2/ready', { headers: AUTH })).status).toBe(200);
      const loading = await http(port, 'GET', '/v2/models/mlp/versions/3/ready', { headers: AUTH });
      expect(loading.status).toBe(503);
      expect(loading.json).toEqual({ error: expect.stringContaining('not ready') });
      expect((await http(port, 'GET', '/v2/models/broken/ready', { headers: AUTH })).status).toBe(503);
      expect((await http(port, 'GET', '/v2/models/nope/ready', { headers: AUTH })).status).toBe(404);
      expect((await http(port, 'GET', '/v2/models/mlp/versions/7/ready', { headers: AUTH })).status).toBe(404);
    });

    it('lists every version in the repository index, or only the ready ones', async () => {
      const all = await http(port, 'POST', '/v2/repository/index', { headers: AUTH });
      expect(all.status).toBe(200);
      expect(all.json).toEqual([
        { name: 'mlp', version: '1', state: 'UNAVAILABLE' },
        { name: 'mlp', version: '2', state: 'READY' },
        { name: 'mlp', version: '3', state: 'LOADING' },
        { name: 'broken', version: '1', state: 'UNAVAILABLE', reason: 'bad artifact' },
      ]);
      const ready = await postJson(port, '/v2/repository/index', { ready: true });
      expect(ready.json).toEqual([{ name: 'mlp', version: '2', state: 'READY' }]);
      expect((await postJson(port, '/v2/repository/index', { ready: 'yes' })).status).toBe(400);
    });

    it('round-trips JSON tensors through the router as raw bytes', async () => {
      routerState.requests.length = 0;
      const reply = await postJson(
        port,
        '/v2/models/mlp/infer',
        {
          id: 'r-1',
          parameters: { priority: 2, note: 'x' },
          inputs: [
            {
              name: 'input',
              shape: [2, 2],
              datatype: 'FP32',
              data: [
                [1.5, -2],
                [0.25, 8],
              ],
            },
            { name: 'ids', shape: [3], datatype: 'INT64', data: [1, '-9007199254740993', 3] },
            { name: 'text', shape: [2], datatype: 'BYTES', data: ['héllo', ''] },
            { name: 'flags', shape: [1, 2], datatype: 'BOOL', data: [true, false] },
          ],
        },
        { ...AUTH, 'x-request-id': 'client-id-42' },
      );
      expect(reply.status).toBe(200);
      expect(reply.headers['x-request-id']).toBe('client-id-42');
      expect(reply.json).toEqual({
        model_name: 'mlp',
        model_version: '3',
        id: 'r-1',
        parameters: { priority: 2, note: 'x', cached: false, degraded: false },
        outputs: [
          { name: 'input', datatype: 'FP32', shape: [2, 2], data: [1.5, -2, 0.25, 8] },
          { name: 'ids', datatype: 'INT64', shape: [3], data: [1, '-9007199254740993', 3] },
          { name: 'text', datatype: 'BYTES', shape: [2], data: ['héllo', ''] },
          { name: 'flags', datatype: 'BOOL', shape: [1, 2], data: [true, false] },
        ],
      });
      const [seen] = routerState.requests;
      expect(seen!.requestId).toBe('client-id-42');
      expect(Buffer.from(seen!.request.inputs[0]!.data)).toEqual(f32([1.5, -2, 0.25, 8]));
      // No deadline given: the default (30 s) applies, and reaches the router as it was set.
      expect(seen!.deadlineMs! - clock.now()).toBeGreaterThanOrEqual(30_000);
      expect(seen!.deadlineMs! - clock.now()).toBeLessThan(60_000);
    });

    it('asks the router for the version in the path and only the outputs requested', async () => {
      routerState.requests.length = 0;
      const reply = await postJson(port, '/v2/models/mlp/versions/2/infer', {
        inputs: [
          { name: 'a', shape: [1], datatype: 'INT8', data: [-128] },
          { name: 'b', shape: [1], datatype: 'UINT16', data: [65535] },
        ],
        outputs: [{ name: 'b' }],
      });
      expect(reply.json).toMatchObject({ model_version: '2', outputs: [{ name: 'b', data: [65535] }] });
      expect(reply.json).not.toHaveProperty('id');
      expect(routerState.requests[0]!.request).toMatchObject({ modelVersion: '2', outputNames: ['b'] });
    });

    it('asks the router for the top classes of an output with class_count, and answers 400 to a bad one', async () => {
      routerState.requests.length = 0;
      const inputs = [{ name: 'scores', shape: [1, 3], datatype: 'FP32', data: [0.5, 2, 1] }];
      const reply = await postJson(port, '/v2/models/mlp/infer', {
        inputs,
        outputs: [{ name: 'scores', parameters: { class_count: 2 } }],
      });
      expect(reply.status).toBe(200);
      expect(routerState.requests[0]!.request).toMatchObject({
        outputNames: ['scores'],
        outputClassCounts: { scores: 2 },
      });
      for (const classCount of [0, -1, 1.5, '2']) {
        const bad = await postJson(port, '/v2/models/mlp/infer', {
          inputs,
          outputs: [{ name: 'scores', parameters: { class_count: classCount } }],
        });
        expect([bad.status, classCount]).toEqual([400, classCount]);
        expect(bad.json).toEqual({
          error: expect.stringContaining('output "scores": parameter "class_count" must be a positive integer'),
        });
      }
      expect(routerState.requests).toHaveLength(1);
    });

    it('reports cached and degraded responses in the parameters', async () => {
      const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
      expect((await postJson(port, '/v2/models/cached/infer', { inputs: [input] })).json).toMatchObject({
        parameters: { cached: true, degraded: false },
      });
      expect((await postJson(port, '/v2/models/degraded/infer', { inputs: [input] })).json).toMatchObject({
        parameters: { cached: false, degraded: true },
      });
    });

    it('takes the deadline from x-request-timeout-ms or the Triton timeout parameter, the earliest winning', async () => {
      routerState.requests.length = 0;
      const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
      await postJson(port, '/v2/models/mlp/infer', { inputs: [input] }, { ...AUTH, 'x-request-timeout-ms': '20000' });
      await postJson(
        port,
        '/v2/models/mlp/infer',
        { inputs: [input], parameters: { timeout: 10_000_000 } },
        { ...AUTH, 'x-request-timeout-ms': '50000' },
      );
      // Each deadline as the gateway set it (its clock stands still), below the next one it could have been.
      const [byHeader, byParameter] = routerState.requests.map((r) => r.deadlineMs! - clock.now());
      expect(byHeader).toBeGreaterThanOrEqual(20_000);
      expect(byHeader).toBeLessThan(30_000); // not the default
      expect(byParameter).toBeGreaterThanOrEqual(10_000);
      expect(byParameter).toBeLessThan(20_000); // not the header's 50 s
      const bad = await postJson(
        port,
        '/v2/models/mlp/infer',
        { inputs: [input] },
        { ...AUTH, 'x-request-timeout-ms': 'soon' },
      );
      expect(bad.status).toBe(400);
      expect(
        (await postJson(port, '/v2/models/mlp/infer', { inputs: [input], parameters: { timeout: -5 } })).status,
      ).toBe(400);
    });

    it.each([
      ['an unknown datatype', { name: 'x', shape: [1], datatype: 'FP8', data: [1] }, /input "x".*FP8/],
      ['too few elements', { name: 'x', shape: [2, 2], datatype: 'FP32', data: [1, 2, 3] }, /input "x".*3 elements.*4/],
      ['a NaN string', { name: 'x', shape: [1], datatype: 'FP32', data: ['NaN'] }, /input "x".*finite number/],
      ['an out-of-range integer', { name: 'x', shape: [1], datatype: 'UINT8', data: [256] }, /input "x".*UINT8 range/],
      ['a negative dimension', { name: 'x', shape: [-1], datatype: 'FP32', data: [] }, /input "x".*dimension -1/],
      ['no data', { name: 'x', shape: [1], datatype: 'FP32' }, /input "x" has no "data"/],
      ['no datatype', { name: 'x', shape: [1], data: [1] }, /input "x" has no datatype/],
      [
        'binary data',
        { name: 'x', shape: [1], datatype: 'FP32', data: [1], parameters: { binary_data_size: 4 } },
        /input "x".*binary/,
      ],
    ])('answers 400 naming the tensor for %s', async (_label, input, message) => {
      const reply = await postJson(port, '/v2/models/mlp/infer', { inputs: [input] });
      expect(reply.status).toBe(400);
      expect((reply.json as { error: string }).error).toMatch(message);
    });

    it('never answers 500 to odd bodies', async () => {
      const bodies = [
        'null',
        '[]',
        '{}',
        '"text"',
        '{"inputs": {}}',
        '{"inputs": [null]}',
        '{"inputs": [{"name": 1}]}',
        '{"inputs": [{"name": "x", "shape": "x"}]}',
        '{"inputs":[{"name":"x","shape":[1e300,1e300],"datatype":"FP32","data":[]}]}',
        '{"id": 5, "inputs": []}',
        '{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"parameters":{"p":{}}}',
        '{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"outputs":"y"}',
      ];
      for (const body of bodies) {
        const reply = await postJson(port, '/v2/models/mlp/infer', body);
        expect([reply.status, body]).toEqual([400, body]);
        expect(reply.json).toEqual({ error: expect.any(String) });
      }
    });

    it('answers 400 with {"error"} to malformed JSON', async () => {
      const reply = await postJson(port, '/v2/models/mlp/infer', '{"inputs": [');
      expect(reply.status).toBe(400);
      expect(reply.json).toEqual({ error: expect.stringContaining('malformed JSON') });
    });

    it('answers 413 to a body over the limit, announced or streamed', async () => {
      const big = Buffer.alloc(MAX_BODY_BYTES + 1, 0x20);
      const announced = await http(port, 'POST', '/v2/models/mlp/infer', {
        headers: { ...AUTH, 'content-length': String(big.length) },
        body: big,
      });
      expect(announced.status).toBe(413);
      expect(announced.json).toEqual({ error: expect.stringContaining(String(MAX_BODY_BYTES)) });
      const streamed = await http(port, 'POST', '/v2/models/mlp/infer', {
        headers: AUTH,
        chunks: [big.subarray(0, 3000), big.subarray(3000)],
      });
      expect(streamed.status).toBe(413);
    });

    it('passes upstream errors on with the REST status of their code', async () => {
      const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
      const missing = await postJson(port, '/v2/models/missing/infer', { inputs: [input] });
      expect([missing.status, missing.json]).toEqual([404, { error: 'model "missing" not found' }]);
      const strict = await postJson(port, '/v2/models/strict/infer', { inputs: [input] });
      expect([strict.status, strict.json]).toEqual([400, { error: expect.stringContaining('input "x"') }]);
      // The router holds "held" past the request's deadline.
      const held = await postJson(
        port,
        '/v2/models/held/infer',
        { inputs: [input] },
        { ...AUTH, 'x-request-timeout-ms': '100' },
      );
      expect([held.status, held.json]).toEqual([504, { error: expect.stringContaining('deadline') }]);
      const busy = await postJson(port, '/v2/models/busy/infer', { inputs: [input] });
      expect(busy.status).toBe(429);
      expect(busy.headers['retry-after']).toBe('2');
    });

    it('answers 404 to unknown routes and 405 to known ones asked with the wrong method', async () => {
      const unknown = await http(port, 'GET', '/v3/anything', { headers: AUTH });
      expect([unknown.status, unknown.json]).toEqual([404, { error: expect.any(String) }]);
      const wrongMethod = await http(port, 'GET', '/v2/models/mlp/infer', { headers: AUTH });
      expect(wrongMethod.status).toBe(405);
      expect(wrongMethod.headers['allow']).toBe('POST');
      expect(wrongMethod.json).toEqual({ error: expect.any(String) });
    });

    it('records request durations by route template, not by raw path', async () => {
      await http(port, 'GET', '/v2/models/some-model-name', { headers: AUTH });
      const metrics = await (await fetch(`http://127.0.0.1:${gateway.metricsPort}/metrics`)).text();
      expect(metrics).toMatch(
        /infermesh_gateway_request_duration_seconds_count\{protocol="rest",endpoint="GET \/v2\/models\/:model",code="404"\} \d+/,
      );
      expect(metrics).not.toContain('some-model-name');
      expect(metrics).toMatch(/infermesh_gateway_inference_requests_total\{model="mlp",version="3",outcome="ok"\} \d+/);
      expect(metrics).toMatch(
        /infermesh_gateway_inference_requests_total\{model="\(unknown\)",version="",outcome="not_found"\} \d+/,
      );
    });
  });

  describe(GatewayGrpcController.name, () => {
    const metadata = AUTH;
    const inferRequest = (init: Parameters<typeof create<typeof ModelInferRequestSchema>>[1]): ModelInferRequest =>
      create(ModelInferRequestSchema, init);

    it('passes the routing key on: x-routing-key over REST and gRPC, else the tenant (a digest of the API key, never the key)', async () => {
      const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
      const grpcInput = {
        modelName: 'tiny',
        inputs: [{ name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
      };
      const keyOf = () => routerState.requests.at(-1)!.request.routingKey;

      await postJson(port, '/v2/models/tiny/infer', { inputs: [input] }, { ...AUTH, 'x-routing-key': 'user-42' });
      expect(keyOf()).toBe('user-42');
      await grpcClient.modelInfer(inferRequest(grpcInput), { metadata: { ...metadata, 'x-routing-key': 'user-43' } });
      expect(keyOf()).toBe('user-43');
      await postJson(port, '/v2/models/tiny/infer', { inputs: [input] });
      const fromKey = keyOf();
      // Without x-routing-key the routing key is the tenant: the API key's digest.
      expect(routerState.requests.at(-1)!.request.tenant).toBe(fromKey);
      await grpcClient.modelInfer(inferRequest(grpcInput), { metadata });
      expect(keyOf()).toBe(fromKey);
      expect(fromKey).toMatch(/^key:[0-9a-f]{32}$/);
      expect(fromKey).not.toContain(KEY);
      const other = await postJson(
        port,
        '/v2/models/tiny/infer',
        { inputs: [input] },
        { authorization: 'Bearer other-key-abcdefghijkl' },
      );
      expect(other.status).toBe(200);
      expect(keyOf()).not.toBe(fromKey);

      const bad = await postJson(
        port,
        '/v2/models/tiny/infer',
        { inputs: [input] },
        { ...AUTH, 'x-routing-key': 'has space' },
      );
      expect([bad.status, bad.json]).toEqual([400, { error: expect.stringContaining('x-routing-key') }]);
    });

    it('answers ServerLive and ServerReady without a key, the rest only with one', async () => {
      expect(await grpcClient.serverLive({})).toMatchObject({ live: true });
      expect(await grpcClient.serverReady({})).toMatchObject({ ready: true });
      await expect(grpcClient.serverMetadata({})).rejects.toMatchObject({ code: status.UNAUTHENTICATED });
      await expect(
        grpcClient.modelInfer({ modelName: 'mlp' }, { metadata: { authorization: 'Bearer nope' } }),
      ).rejects.toMatchObject({
        code: status.UNAUTHENTICATED,
      });
      expect(await grpcClient.serverMetadata({}, { metadata })).toMatchObject({
        name: 'infermesh',
        extensions: expect.arrayContaining(['model_repository']),
      });
    });

    it('answers ModelMetadata and ModelReady from the registry', async () => {
      const meta = await grpcClient.modelMetadata({ name: 'mlp' }, { metadata });
      expect(meta).toMatchObject({
        name: 'mlp',
        versions: ['2', '3'],
        inputs: [{ name: 'input', datatype: 'FP32', shape: [-1n, 4n] }],
      });
      expect(await grpcClient.modelReady({ name: 'mlp' }, { metadata })).toMatchObject({ ready: true });
      expect(await grpcClient.modelReady({ name: 'mlp', version: '3' }, { metadata })).toMatchObject({ ready: false });
      await expect(grpcClient.modelReady({ name: 'nope' }, { metadata })).rejects.toMatchObject({
        code: status.NOT_FOUND,
      });
    });

    it('round-trips raw inputs to raw outputs with the served version and flags', async () => {
      const response = await grpcClient.modelInfer(
        inferRequest({
          modelName: 'cached',
          id: 'g-1',
          inputs: [
            { name: 'x', datatype: 'FP32', shape: [1n, 2n] },
            { name: 'h', datatype: 'FP16', shape: [1n] },
          ],
          rawInputContents: [f32([1, 2]), Buffer.from([0x00, 0x3c])],
        }),
        { metadata },
      );
      expect(response).toMatchObject({ modelName: 'cached', modelVersion: '3', id: 'g-1' });
      expect(response.outputs.map((o) => [o.name, o.datatype, o.shape])).toEqual([
        ['x', 'FP32', [1n, 2n]],
        ['h', 'FP16', [1n]],
      ]);
      expect(Buffer.from(response.rawOutputContents[0]!)).toEqual(f32([1, 2]));
      expect(response.parameters['cached']?.parameterChoice).toEqual({ case: 'boolParam', value: true });
      expect(response.parameters['degraded']?.parameterChoice).toEqual({ case: 'boolParam', value: false });
    });

    it('accepts typed contents and gives the router raw bytes', async () => {
      routerState.requests.length = 0;
      await grpcClient.modelInfer(
        inferRequest({
          modelName: 'mlp',
          inputs: [{ name: 'x', datatype: 'INT16', shape: [2n], contents: { intContents: [-2, 300] } }],
        }),
        { metadata, timeoutMs: 10_000 },
      );
      const [seen] = routerState.requests;
      expect(Buffer.from(seen!.request.inputs[0]!.data)).toEqual(Buffer.from(Int16Array.from([-2, 300]).buffer));
      // The caller's deadline, not the default (30 s).
      expect(seen!.deadlineMs! - clock.now()).toBeGreaterThanOrEqual(10_000);
      expect(seen!.deadlineMs! - clock.now()).toBeLessThan(30_000);
    });

    it('refuses bad tensors with INVALID_ARGUMENT naming the tensor', async () => {
      const bad = inferRequest({
        modelName: 'mlp',
        inputs: [{ name: 'x', datatype: 'FP32', shape: [3n] }],
        rawInputContents: [f32([1, 2])],
      });
      await expect(grpcClient.modelInfer(bad, { metadata })).rejects.toMatchObject({
        code: status.INVALID_ARGUMENT,
        message: expect.stringContaining('input "x"'),
      });
    });

    it('asks the router for the top classes of an output with an int64 class_count, refusing a bad one', async () => {
      routerState.requests.length = 0;
      const classCount = (value: bigint) => ({
        modelName: 'mlp',
        inputs: [{ name: 'x', datatype: 'FP32', shape: [1n] }],
        outputs: [
          { name: 'x', parameters: { class_count: { parameterChoice: { case: 'int64Param' as const, value } } } },
        ],
        rawInputContents: [f32([1])],
      });
      await grpcClient.modelInfer(inferRequest(classCount(1n)), { metadata });
      expect(routerState.requests[0]!.request.outputClassCounts).toEqual({ x: 1 });
      await expect(grpcClient.modelInfer(inferRequest(classCount(0n)), { metadata })).rejects.toMatchObject({
        code: status.INVALID_ARGUMENT,
        message: expect.stringContaining('output "x": parameter "class_count" must be a positive integer'),
      });
      expect(routerState.requests).toHaveLength(1);
    });

    it('passes upstream codes through', async () => {
      const req = inferRequest({
        modelName: 'busy',
        inputs: [{ name: 'x', datatype: 'FP32', shape: [1n] }],
        rawInputContents: [f32([1])],
      });
      await expect(grpcClient.modelInfer(req, { metadata })).rejects.toMatchObject({
        code: status.RESOURCE_EXHAUSTED,
        retryDelayMs: 1500,
      });
    });
  });
});

describe('gateway with its upstreams down', () => {
  let gateway: RunningService;
  let registry: Upstream;

  beforeAll(async () => {
    registry = await startUpstream(
      (s) => s.add(RegistryService, fakeRegistry()),
      'infermesh.registry.v1.RegistryService',
    );
    // Nothing listens on the router's port.
    gateway = await startTestGateway(`127.0.0.1:${await freePort()}`, registry.address);
  });

  afterAll(async () => {
    await gateway?.stop();
    await registry?.stop();
  });

  it('answers 503 to inference and to readiness while the router cannot be reached', async () => {
    const port = gateway.httpPort!;
    const infer = await postJson(port, '/v2/models/mlp/infer', {
      inputs: [{ name: 'x', shape: [1], datatype: 'FP32', data: [1] }],
    });
    expect(infer.status).toBe(503);
    expect(infer.json).toEqual({ error: expect.stringContaining('router') });
    expect(infer.text).not.toContain('127.0.0.1');
    const ready = await http(port, 'GET', '/v2/health/ready');
    expect(ready.status).toBe(503);
    expect(ready.json).toEqual({ error: expect.any(String) });
    // Metadata needs only the registry, which is up.
    expect((await http(port, 'GET', '/v2/models/mlp', { headers: AUTH })).status).toBe(200);
  });
});

describe('gateway at its limit of requests in flight', () => {
  it('refuses inference beyond GATEWAY_MAX_IN_FLIGHT at once: 429 with Retry-After on REST, RESOURCE_EXHAUSTED (OVERLOADED) on gRPC', async () => {
    const routerState: FakeRouter = { requests: [] };
    const router = await startUpstream(
      (s) => s.add(RouterService, fakeRouter(routerState), { infers: 'infer' }),
      'infermesh.router.v1.RouterService',
    );
    const registry = await startUpstream(
      (s) => s.add(RegistryService, fakeRegistry()),
      'infermesh.registry.v1.RegistryService',
    );
    const gateway = await startTestGateway(router.address, registry.address, { GATEWAY_MAX_IN_FLIGHT: '2' });
    const grpcClient = createClient(GRPCInferenceService, `127.0.0.1:${gateway.grpcPort}`);
    try {
      const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
      // Two requests the router holds until the spec lets them go fill the gateway.
      let release!: () => void;
      routerState.hold = new Promise((resolve) => (release = resolve));
      let answered = 0;
      const held = [
        postJson(gateway.httpPort!, '/v2/models/held/infer', { inputs: [input] }),
        postJson(gateway.httpPort!, '/v2/models/held/infer', { inputs: [input] }),
      ].map((reply) => reply.finally(() => (answered += 1)));
      await eventually(() => routerState.requests.length === 2);

      const refused = await postJson(gateway.httpPort!, '/v2/models/tiny/infer', { inputs: [input] });
      const grpcError = await rpcRejection(
        grpcClient.modelInfer(
          create(ModelInferRequestSchema, {
            modelName: 'tiny',
            inputs: [{ name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
          }),
          {
            metadata: AUTH,
          },
        ),
      );

      // Refused at once: while the two requests in flight are still held.
      expect(answered).toBe(0);
      expect(refused.status).toBe(429);
      expect(refused.headers['retry-after']).toBe('1');
      expect(refused.json).toEqual({ error: expect.stringContaining('GATEWAY_MAX_IN_FLIGHT') });
      expect([grpcError.code, grpcError.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'OVERLOADED']);
      expect(routerState.requests).toHaveLength(2);
      release();
      expect((await Promise.all(held)).map((r) => r.status)).toEqual([200, 200]);
      // Once they are answered, requests pass again.
      expect((await postJson(gateway.httpPort!, '/v2/models/tiny/infer', { inputs: [input] })).status).toBe(200);
    } finally {
      grpcClient.close();
      await gateway.stop();
      await router.stop();
      await registry.stop();
    }
  });
});
