import { buildMlpModel, buildMultiIoModel } from '@infermesh/model-builder';
import * as ort from 'onnxruntime-node';
import { API_KEY, type Fixture, startFixture } from './support/system-fixture';
import { kserveClient } from './support/kserve-grpc-client';

/** Deterministic inputs in [-1, 1). */
function inputs(count: number, seed: number): Float32Array {
  const out = new Float32Array(count);
  let s = seed >>> 0;
  for (let i = 0; i < count; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1;
  }
  return out;
}

function bits(values: ArrayLike<number>): Buffer {
  return Buffer.from(Float32Array.from(values).buffer);
}

describe('serving through the whole system (embedded stores)', () => {
  let fixture: Fixture;
  let url: string;
  let grpcClient: ReturnType<typeof kserveClient>;
  const auth = { authorization: `Bearer ${API_KEY}` };

  const post = (path: string, body: unknown, headers: Record<string, string> = auth) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });

  beforeAll(async () => {
    fixture = await startFixture({ models: ['mlp', 'tiny', 'multi-io'] });
    url = fixture.system.gatewayUrl;
    grpcClient = kserveClient(fixture.system.gatewayGrpcAddress);
  });

  afterAll(async () => {
    grpcClient?.close();
    await fixture?.stop();
  });

  it('reports live and ready without a key', async () => {
    expect((await fetch(`${url}/v2/health/live`)).status).toBe(200);
    expect((await fetch(`${url}/v2/health/ready`)).status).toBe(200);
    expect(await grpcClient.call('ServerReady', {})).toEqual({ ready: true });
  });

  it('lists the demo models READY in the repository index', async () => {
    const res = await post('/v2/repository/index', {});
    expect(res.status).toBe(200);
    const index = (await res.json()) as { name: string; version: string; state: string }[];
    expect(index).toEqual(expect.arrayContaining([{ name: 'mlp', version: '1', state: 'READY' }]));
  });

  it('describes the MLP in its metadata over REST and gRPC', async () => {
    const res = await fetch(`${url}/v2/models/mlp`, { headers: auth });
    expect(res.status).toBe(200);
    const metadata = await res.json();
    expect(metadata).toMatchObject({
      name: 'mlp',
      versions: ['1'],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 512] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 512] }],
    });
    const grpcMetadata = await grpcClient.call('ModelMetadata', { name: 'mlp' }, API_KEY);
    expect(grpcMetadata).toMatchObject({
      name: 'mlp',
      inputs: [{ name: 'input', datatype: 'FP32', shape: ['-1', '512'] }],
    });
  });

  it('answers REST and gRPC with the same outputs as onnxruntime-node in-process, bit for bit', async () => {
    const data = inputs(2 * 512, 7);
    const session = await ort.InferenceSession.create(buildMlpModel().bytes);
    const expected = (await session.run({ input: new ort.Tensor('float32', data, [2, 512]) }))['output']!;
    await session.release();

    const res = await post('/v2/models/mlp/infer', {
      id: 'req-1',
      inputs: [{ name: 'input', shape: [2, 512], datatype: 'FP32', data: Array.from(data) }],
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as {
      id: string;
      model_version: string;
      outputs: { name: string; shape: number[]; data: number[] }[];
    };
    expect(body.id).toBe('req-1');
    expect(body.model_version).toBe('1');
    expect(body.outputs[0]!.shape).toEqual([2, 512]);
    expect(bits(body.outputs[0]!.data).equals(bits(expected.data as Float32Array))).toBe(true);

    const grpcResponse = await grpcClient.call<{
      model_version: string;
      outputs: { name: string; shape: string[] }[];
      raw_output_contents: Buffer[];
    }>(
      'ModelInfer',
      {
        model_name: 'mlp',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [2, 512] }],
        raw_input_contents: [Buffer.from(data.buffer)],
      },
      API_KEY,
    );
    expect(grpcResponse.model_version).toBe('1');
    expect(grpcResponse.outputs[0]!.shape).toEqual(['2', '512']);
    expect(Buffer.compare(grpcResponse.raw_output_contents[0]!, bits(expected.data as Float32Array))).toBe(0);
  });

  it('serves a model with several inputs and outputs of different datatypes', async () => {
    const model = buildMultiIoModel();
    const session = await ort.InferenceSession.create(model.bytes);
    const x = new Float32Array([1.5, -2, 0, 3.25, -0.5, 4, -8, 2]);
    const ids = new BigInt64Array([1n, 2n, -3n, 40n]);
    const expected = await session.run({
      x: new ort.Tensor('float32', x, [2, 4]),
      ids: new ort.Tensor('int64', ids, [2, 2]),
    });
    await session.release();

    const res = await post('/v2/models/multi-io/infer', {
      inputs: [
        {
          name: 'x',
          shape: [2, 4],
          datatype: 'FP32',
          data: [
            [1.5, -2, 0, 3.25],
            [-0.5, 4, -8, 2],
          ],
        },
        { name: 'ids', shape: [2, 2], datatype: 'INT64', data: [1, 2, -3, 40] },
      ],
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { outputs: { name: string; datatype: string; data: unknown[] }[] };
    const byName = new Map(body.outputs.map((o) => [o.name, o]));
    for (const name of model.outputs.map((o) => o.name)) {
      const want = expected[name]!;
      const got = byName.get(name)!;
      expect(got).toBeDefined();
      const wantValues = Array.from(want.data as ArrayLike<number | bigint | boolean>, (v) =>
        typeof v === 'bigint' ? Number(v) : want.type === 'bool' ? v !== 0 && v !== false : v,
      );
      expect(got.data).toEqual(wantValues);
    }

    const typed = await grpcClient.call<{
      outputs: { name: string; datatype: string }[];
      raw_output_contents: Buffer[];
    }>(
      'ModelInfer',
      {
        model_name: 'multi-io',
        inputs: [
          { name: 'x', datatype: 'FP32', shape: [2, 4], contents: { fp32_contents: Array.from(x) } },
          { name: 'ids', datatype: 'INT64', shape: [2, 2], contents: { int64_contents: ['1', '2', '-3', '40'] } },
        ],
      },
      API_KEY,
    );
    expect(typed.outputs.map((o) => o.name).sort()).toEqual(model.outputs.map((o) => o.name).sort());
  });

  describe('refuses bad requests with the right status and a message', () => {
    const tinyInput = { name: 'input', shape: [1, 4], datatype: 'FP32', data: [1, 2, 3, 4] };

    it.each([
      ['no key', {}],
      ['a wrong key', { authorization: 'Bearer not-the-key-at-all' }],
      ['a malformed header', { authorization: 'Basic abc' }],
    ])('401 with %s', async (_label, headers) => {
      const res = await post('/v2/models/tiny/infer', { inputs: [tinyInput] }, headers);
      expect(res.status).toBe(401);
      expect(await res.json()).toEqual({ error: expect.any(String) });
      expect((await fetch(`${url}/v2/models/tiny`, { headers: headers as Record<string, string> })).status).toBe(401);
    });

    it('UNAUTHENTICATED over gRPC without a key or with a wrong one', async () => {
      for (const key of [undefined, 'wrong-key-0000000000']) {
        await expect(grpcClient.call('ModelInfer', { model_name: 'tiny' }, key)).rejects.toMatchObject({ code: 16 });
      }
    });

    it('404 / NOT_FOUND for an unknown model', async () => {
      const res = await post('/v2/models/no-such-model/infer', { inputs: [tinyInput] });
      expect(res.status).toBe(404);
      expect(((await res.json()) as { error: string }).error).toContain('no-such-model');
      await expect(
        grpcClient.call(
          'ModelInfer',
          {
            model_name: 'no-such-model',
            inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4] }],
            raw_input_contents: [Buffer.alloc(16)],
          },
          API_KEY,
        ),
      ).rejects.toMatchObject({ code: 5 });
    });

    it.each([
      ['a shape the model does not take', { ...tinyInput, shape: [1, 5], data: [1, 2, 3, 4, 5] }],
      ['a datatype the model does not take', { ...tinyInput, datatype: 'INT32' }],
      ['data whose length disagrees with the shape', { ...tinyInput, data: [1, 2, 3] }],
      ['an input name the model does not have', { ...tinyInput, name: 'wrong' }],
      ['a value out of range', { ...tinyInput, datatype: 'FP32', data: [1, 2, 3, 'x'] }],
    ])('400 for %s, naming the tensor', async (_label, input) => {
      const res = await post('/v2/models/tiny/infer', { inputs: [input] });
      expect(res.status).toBe(400);
      const { error } = (await res.json()) as { error: string };
      expect(error).toMatch(/input|wrong/);
    });

    it('INVALID_ARGUMENT over gRPC when raw contents disagree with the shape', async () => {
      await expect(
        grpcClient.call(
          'ModelInfer',
          {
            model_name: 'tiny',
            inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4] }],
            raw_input_contents: [Buffer.alloc(12)],
          },
          API_KEY,
        ),
      ).rejects.toMatchObject({ code: 3, details: expect.stringContaining('input') });
    });

    it('400 for malformed JSON', async () => {
      const res = await post('/v2/models/tiny/infer', '{"inputs": [');
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({ error: expect.any(String) });
    });

    it('never answers 500 to a burst of odd bodies', async () => {
      const bodies = [
        'null',
        '[]',
        '{}',
        '{"inputs": {}}',
        '{"inputs": [null]}',
        '{"inputs": [{"name": 1}]}',
        '"text"',
        '{"inputs":[{"name":"input","shape":"x","datatype":"FP32","data":[]}]}',
      ];
      for (const body of bodies) {
        const res = await post('/v2/models/tiny/infer', body);
        expect(res.status).toBeGreaterThanOrEqual(400);
        expect(res.status).toBeLessThan(500);
      }
    });
  });
});
