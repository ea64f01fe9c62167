import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import {
  GRPCInferenceService,
  type ModelInferRequest,
  ModelInferRequestSchema,
} from '@infermesh/proto/gen/inference/grpc_service_pb';
import type { RunningService } from '@infermesh/runtime';
import { rpcRejection } from '@infermesh/testing';
import { inferRequestFromGrpc } from './grpc-codec';
import { inferRequestFromJson } from './rest-codec';
import { checkName, DEFAULT_TENSOR_LIMITS } from './tensor-limits';
import { type FakeUpstreams, http, postJson, startFakeUpstreams, startTestGateway } from '../testing/gateway-harness';

const KEY = 'limits-spec-key-0123456789';
const AUTH = { authorization: `Bearer ${KEY}` };
const INFER = '/v2/models/mlp/infer';

// A gateway with small limits: 3 inputs, 64 elements per tensor, a batch of 8.
const LIMITS = { GATEWAY_MAX_INPUTS: '3', GATEWAY_MAX_TENSOR_ELEMENTS: '64', GATEWAY_MAX_BATCH_SIZE: '8' };

const jsonInput = (name: string, shape: number[]) => ({
  name,
  shape,
  datatype: 'FP32',
  data: new Array<number>(shape.reduce((a, b) => a * b, 1)).fill(1),
});
const elements = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

describe('tensor limits', () => {
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

  beforeEach(() => {
    upstreams.routerState.requests.length = 0;
  });

  const restJson = (shapes: number[][]) =>
    postJson(port, INFER, { inputs: shapes.map((shape, i) => jsonInput(`t${i}`, shape)) }, AUTH);
  const restBinary = (shapes: number[][]) => {
    const header = Buffer.from(
      JSON.stringify({
        inputs: shapes.map((shape, i) => ({
          name: `t${i}`,
          shape,
          datatype: 'FP32',
          parameters: { binary_data_size: elements(shape) * 4 },
        })),
      }),
    );
    const body = Buffer.concat([header, ...shapes.map((shape) => Buffer.alloc(elements(shape) * 4))]);
    return http(port, 'POST', INFER, {
      headers: { ...AUTH, 'inference-header-content-length': String(header.length) },
      body,
    });
  };
  const grpcRequest = (shapes: number[][], raw: boolean): ModelInferRequest =>
    create(ModelInferRequestSchema, {
      modelName: 'mlp',
      inputs: shapes.map((shape, i) => ({
        name: `t${i}`,
        datatype: 'FP32',
        shape: shape.map(BigInt),
        ...(!raw && { contents: { fp32Contents: new Array<number>(elements(shape)).fill(1) } }),
      })),
      rawInputContents: raw ? shapes.map((shape) => new Uint8Array(elements(shape) * 4)) : [],
    });

  /** Sends FP32 tensors of these shapes in each of the four forms a request can take: whether each was served, and its status and error when not. */
  async function everyWay(
    shapes: number[][],
    served: boolean,
  ): Promise<{ way: string; ok: boolean; message: string }[]> {
    const rest = async (way: string, send: () => ReturnType<typeof http>) => {
      const reply = await send();
      return {
        way,
        ok: reply.status === 200,
        message: reply.status === 200 ? '' : `${reply.status} ${(reply.json as { error: string }).error}`,
      };
    };
    const grpc = async (way: string, raw: boolean) => {
      const call = client.modelInfer(grpcRequest(shapes, raw), { metadata: AUTH });
      if (served) {
        await call;
        return { way, ok: true, message: '' };
      }
      const rejection = await rpcRejection(call);
      return { way, ok: false, message: `${status[rejection.code]} ${rejection.message}` };
    };
    return [
      await rest('REST JSON', () => restJson(shapes)),
      await rest('REST binary', () => restBinary(shapes)),
      await grpc('gRPC raw', true),
      await grpc('gRPC typed', false),
    ];
  }

  it('serves requests at every limit', async () => {
    for (const result of await everyWay(
      [
        [8, 8],
        [1, 64],
        [1, 1, 8],
      ],
      true,
    ))
      expect(result).toEqual({ way: result.way, ok: true, message: '' });
    expect(upstreams.routerState.requests).toHaveLength(4);
  });

  it.each([
    [
      'more inputs than GATEWAY_MAX_INPUTS',
      [[1], [1], [1], [1]],
      /^(400|INVALID_ARGUMENT) the request has 4 inputs, over the gateway's limit of 3 inputs per request \(GATEWAY_MAX_INPUTS\)$/,
    ],
    [
      'more elements than GATEWAY_MAX_TENSOR_ELEMENTS',
      [[1], [2, 5, 7]],
      /^(400|INVALID_ARGUMENT) input "t1" has 70 elements, over the gateway's limit of 64 elements per tensor \(GATEWAY_MAX_TENSOR_ELEMENTS\)$/,
    ],
    [
      'a batch over GATEWAY_MAX_BATCH_SIZE',
      [[9, 1]],
      /^(400|INVALID_ARGUMENT) input "t0" has a batch size \(first dimension\) of 9, over the gateway's limit of 8 \(GATEWAY_MAX_BATCH_SIZE\)$/,
    ],
  ])(
    'refuses %s over REST (JSON and binary) and gRPC (raw and typed), naming the tensor and the limit',
    async (_label, shapes, message) => {
      for (const result of await everyWay(shapes, false)) {
        expect(result.ok).toBe(false);
        expect([result.way, result.message]).toEqual([result.way, expect.stringMatching(message)]);
      }
      expect(upstreams.routerState.requests).toEqual([]);
    },
  );

  it('refuses a huge shape before allocating anything for it', () => {
    const body = { inputs: [{ name: 'x', shape: [1, 1_000_000_000], datatype: 'FP32', data: [] }] };
    expect(() => inferRequestFromJson('m', '', body)).toThrow(
      /input "x" has 1000000000 elements, over the gateway's limit of 16777216/,
    );
    const grpc = create(ModelInferRequestSchema, {
      modelName: 'm',
      inputs: [{ name: 'x', datatype: 'FP32', shape: [5000n, 1n], contents: { fp32Contents: [] } }],
    });
    expect(() => inferRequestFromGrpc(grpc)).toThrow(
      /input "x" has a batch size \(first dimension\) of 5000, over the gateway's limit of 4096/,
    );
    expect(DEFAULT_TENSOR_LIMITS).toEqual({
      maxInputs: 64,
      maxTensorElements: 16_777_216,
      maxBatchSize: 4_096,
      maxNameBytes: 1_024,
    });
  });
});

describe(checkName.name, () => {
  const limits = { maxNameBytes: 16 };

  it('accepts a name up to the limit in UTF-8 bytes', () => {
    expect(() => checkName('input name', 'x'.repeat(16), limits)).not.toThrow();
    expect(() => checkName('input name', 'é'.repeat(8), limits)).not.toThrow();
  });

  it('refuses a longer one with a short message naming what, its size and the limit', () => {
    expect(() => checkName('input name', 'é'.repeat(9), limits)).toThrow(
      /^input name "é+" is 18 bytes, over the gateway's limit of 16 bytes per name \(GATEWAY_MAX_NAME_BYTES\)$/,
    );
    let message = '';
    try {
      checkName('output name', 'n'.repeat(600_000), limits);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toContain('…(600000 bytes)');
    expect(message).toContain('GATEWAY_MAX_NAME_BYTES');
    expect(message.length).toBeLessThan(200);
  });

  it('refuses oversized names anywhere in a REST or gRPC request: id, inputs, outputs, parameter keys, model', () => {
    const small = { ...DEFAULT_TENSOR_LIMITS, maxNameBytes: 16 };
    const long = 'n'.repeat(17);
    const input = { name: 'x', shape: [1], datatype: 'FP32', data: [1] };
    const rest = [
      () => inferRequestFromJson(long, '', { inputs: [input] }, { limits: small }),
      () => inferRequestFromJson('m', long, { inputs: [input] }, { limits: small }),
      () => inferRequestFromJson('m', '', { id: long, inputs: [input] }, { limits: small }),
      () => inferRequestFromJson('m', '', { inputs: [{ ...input, name: long }] }, { limits: small }),
      () => inferRequestFromJson('m', '', { inputs: [{ ...input, parameters: { [long]: 1 } }] }, { limits: small }),
      () => inferRequestFromJson('m', '', { inputs: [input], outputs: [{ name: long }] }, { limits: small }),
      () =>
        inferRequestFromJson(
          'm',
          '',
          { inputs: [input], outputs: [{ name: 'y', parameters: { [long]: true } }] },
          { limits: small },
        ),
      () => inferRequestFromJson('m', '', { inputs: [input], parameters: { [long]: 'v' } }, { limits: small }),
    ];
    const grpcInput = { name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } };
    const grpc = [
      { modelName: long, inputs: [grpcInput] },
      { modelName: 'm', modelVersion: long, inputs: [grpcInput] },
      { modelName: 'm', id: long, inputs: [grpcInput] },
      { modelName: 'm', inputs: [{ ...grpcInput, name: long }] },
      { modelName: 'm', inputs: [grpcInput], outputs: [{ name: long }] },
      { modelName: 'm', inputs: [grpcInput], parameters: { [long]: {} } },
    ].map((request) => () => inferRequestFromGrpc(create(ModelInferRequestSchema, request), small));
    for (const decode of [...rest, ...grpc]) expect(decode).toThrow(/GATEWAY_MAX_NAME_BYTES/);
  });
});
