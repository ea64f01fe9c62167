import type { RunningService } from '@infermesh/runtime';
import { encodeBytesElements, toHalfBits } from '@infermesh/tensors';
import { GatewayHttpController } from './gateway.http';
import type { JsonInferResponse } from './rest-codec';
import {
  type FakeUpstreams,
  http,
  postJson as postJsonAs,
  type Reply,
  startFakeUpstreams,
  startTestGateway,
} from '../testing/gateway-harness';

// Triton's binary tensor data extension on the REST API, against the gateway in front of a fake
// identity router: every input comes back as the output of the same name.

const KEY = 'binary-spec-key-0123456789';
const AUTH = { authorization: `Bearer ${KEY}` };
const MAX_BODY_BYTES = 4096;
const INFER = '/v2/models/mlp/infer';

const bytes = (view: ArrayBufferView) => Buffer.from(view.buffer, view.byteOffset, view.byteLength);

/** A body of the extension: the JSON header, then the binary data; and the header saying where the JSON ends. */
function binaryRequest(
  header: unknown,
  data: Uint8Array[],
  headerText = JSON.stringify(header),
): { headers: Record<string, string>; body: Buffer } {
  const json = Buffer.from(headerText, 'utf8');
  return {
    headers: {
      ...AUTH,
      'content-type': 'application/octet-stream',
      'inference-header-content-length': String(json.length),
    },
    body: Buffer.concat([json, ...data]),
  };
}

/** A binary response split into its JSON header and each binary output's bytes, by name. */
function splitBinaryReply(reply: Reply): { header: JsonInferResponse; outputs: Record<string, Buffer> } {
  const headerLength = Number(reply.headers['inference-header-content-length']);
  const header = JSON.parse(reply.body.subarray(0, headerLength).toString('utf8')) as JsonInferResponse;
  const outputs: Record<string, Buffer> = {};
  let offset = headerLength;
  for (const output of header.outputs) {
    if (!('parameters' in output)) continue;
    outputs[output.name] = reply.body.subarray(offset, offset + output.parameters.binary_data_size);
    offset += output.parameters.binary_data_size;
  }
  expect(offset).toBe(reply.body.length);
  return { header, outputs };
}

// The same tensors as JSON and as raw bytes.
const HALVES = [1, -2, 0.3333, 65504]; // written back with the fewest digits that keep their bits
const TENSORS = [
  {
    name: 'f32',
    shape: [2, 2],
    datatype: 'FP32',
    data: [1.5, -2, 0.1, 3.4028235e38],
    raw: bytes(Float32Array.from([1.5, -2, 0.1, 3.4028235e38])),
  },
  {
    name: 'i64',
    shape: [3],
    datatype: 'INT64',
    data: [1, '-9223372036854775808', '9007199254740993'],
    raw: bytes(BigInt64Array.from([1n, -(2n ** 63n), 2n ** 53n + 1n])),
  },
  { name: 'flags', shape: [1, 3], datatype: 'BOOL', data: [true, false, true], raw: Buffer.from([1, 0, 1]) },
  { name: 'f16', shape: [4], datatype: 'FP16', data: HALVES, raw: bytes(Uint16Array.from(HALVES, toHalfBits)) },
  {
    name: 'text',
    shape: [3],
    datatype: 'BYTES',
    data: ['héllo', '', 'ok'],
    raw: encodeBytesElements(['héllo', '', 'ok'].map((s) => Buffer.from(s, 'utf8'))),
  },
];
const metadataOf = ({ name, shape, datatype }: (typeof TENSORS)[number]) => ({ name, shape, datatype });

describe(GatewayHttpController.name, () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;
  let port: number;
  const postJson = (body: unknown) => postJsonAs(port, INFER, body, AUTH);
  const postBinary = (request: ReturnType<typeof binaryRequest>, path = INFER) => http(port, 'POST', path, request);
  const routed = () => upstreams.routerState.requests.map((r) => r.request);

  beforeAll(async () => {
    upstreams = await startFakeUpstreams();
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, {
      GATEWAY_API_KEYS: KEY,
      GATEWAY_MAX_BODY_BYTES: String(MAX_BODY_BYTES),
    });
    port = gateway.httpPort!;
  });

  afterAll(async () => {
    await gateway?.stop();
    await upstreams?.stop();
  });

  beforeEach(() => {
    upstreams.routerState.requests.length = 0;
  });

  describe('binary tensor data extension', () => {
    it('lists binary_tensor_data among the server extensions', async () => {
      expect((await http(port, 'GET', '/v2', { headers: AUTH })).json).toMatchObject({
        extensions: expect.arrayContaining(['binary_tensor_data']),
      });
    });

    it('gives the router the same bytes and answers the same values as the JSON request, bit for bit', async () => {
      const asJson = await postJson({ id: 'j', inputs: TENSORS.map(({ raw: _, ...tensor }) => tensor) });
      expect(asJson.status).toBe(200);
      const binary = await postBinary(
        binaryRequest(
          {
            id: 'b',
            inputs: TENSORS.map((t) => ({ ...metadataOf(t), parameters: { binary_data_size: t.raw.length } })),
            parameters: { binary_data_output: true },
          },
          TENSORS.map((t) => t.raw),
        ),
      );
      expect(binary.status).toBe(200);
      expect(binary.headers['content-type']).toBe('application/octet-stream');

      const [fromJson, fromBinary] = routed();
      for (const [i, tensor] of TENSORS.entries()) {
        expect([tensor.name, Buffer.from(fromBinary!.inputs[i]!.data)]).toEqual([tensor.name, tensor.raw]);
        expect([tensor.name, Buffer.from(fromJson!.inputs[i]!.data)]).toEqual([tensor.name, tensor.raw]);
      }
      expect(fromBinary!.inputs.map((t) => [t.name, t.datatype, t.shape])).toEqual(
        fromJson!.inputs.map((t) => [t.name, t.datatype, t.shape]),
      );

      const { header, outputs } = splitBinaryReply(binary);
      expect(header).toMatchObject({ model_name: 'mlp', model_version: '3', id: 'b' });
      expect(header.outputs).toEqual(
        TENSORS.map((t) => ({ ...metadataOf(t), parameters: { binary_data_size: t.raw.length } })),
      );
      for (const tensor of TENSORS) expect([tensor.name, outputs[tensor.name]]).toEqual([tensor.name, tensor.raw]);
      expect((asJson.json as JsonInferResponse).outputs).toEqual(TENSORS.map(({ raw: _, ...tensor }) => tensor));
    });

    it('answers JSON to binary inputs when no output asks for binary data, and mixes them when some do', async () => {
      const inputs = TENSORS.map((t) => ({ ...metadataOf(t), parameters: { binary_data_size: t.raw.length } }));
      const json = await postBinary(
        binaryRequest(
          { inputs },
          TENSORS.map((t) => t.raw),
        ),
      );
      expect(json.status).toBe(200);
      expect(json.headers['content-type']).toMatch(/^application\/json/);
      expect(json.headers['inference-header-content-length']).toBeUndefined();
      expect((json.json as JsonInferResponse).outputs).toEqual(TENSORS.map(({ raw: _, ...tensor }) => tensor));

      const mixed = await postBinary(
        binaryRequest(
          {
            inputs,
            parameters: { binary_data_output: true },
            outputs: [
              { name: 'f32' },
              { name: 'text', parameters: { binary_data: false } },
              { name: 'i64', parameters: { binary_data: true } },
            ],
          },
          TENSORS.map((t) => t.raw),
        ),
      );
      const { header, outputs } = splitBinaryReply(mixed);
      expect(header.outputs).toEqual([
        { name: 'f32', shape: [2, 2], datatype: 'FP32', parameters: { binary_data_size: 16 } },
        { name: 'i64', shape: [3], datatype: 'INT64', parameters: { binary_data_size: 24 } },
        { name: 'text', shape: [3], datatype: 'BYTES', data: ['héllo', '', 'ok'] },
      ]);
      expect(Object.keys(outputs)).toEqual(['f32', 'i64']);
      expect(outputs['i64']).toEqual(TENSORS[1]!.raw);
    });

    it('sends binary outputs for a JSON request that asks for them', async () => {
      const reply = await postJson({
        inputs: [{ name: 'x', shape: [2], datatype: 'FP32', data: [1, 2] }],
        outputs: [{ name: 'x', parameters: { binary_data: true } }],
      });
      expect(reply.status).toBe(200);
      expect(splitBinaryReply(reply).outputs['x']).toEqual(bytes(Float32Array.from([1, 2])));
    });

    it('takes JSON data and binary data side by side, and a header as long as the whole body', async () => {
      const mixed = await postBinary(
        binaryRequest(
          {
            inputs: [
              { name: 'a', shape: [1], datatype: 'FP32', parameters: { binary_data_size: 4 } },
              { name: 'b', shape: [1], datatype: 'INT8', data: [-3] },
              { name: 'c', shape: [0], datatype: 'FP32', parameters: { binary_data_size: 0 } },
            ],
          },
          [bytes(Float32Array.from([7]))],
        ),
      );
      expect(mixed.status).toBe(200);
      expect((mixed.json as JsonInferResponse).outputs.map((o) => ('data' in o ? o.data : o))).toEqual([[7], [-3], []]);
      const jsonOnly = await postBinary(
        binaryRequest({ inputs: [{ name: 'a', shape: [1], datatype: 'FP32', data: [2] }] }, []),
      );
      expect(jsonOnly.status).toBe(200);
    });

    const header = (inputs: unknown[]) => ({ inputs });
    const f32 = (name: string, shape: number[], size: unknown) => ({
      name,
      shape,
      datatype: 'FP32',
      parameters: { binary_data_size: size },
    });
    it.each<[string, ReturnType<typeof binaryRequest>, RegExp]>([
      [
        'a header length that is not a number',
        { ...binaryRequest(header([]), []), headers: { ...AUTH, 'inference-header-content-length': 'ten' } },
        /Inference-Header-Content-Length must be a non-negative integer.*"ten"/,
      ],
      [
        'a negative header length',
        { ...binaryRequest(header([]), []), headers: { ...AUTH, 'inference-header-content-length': '-1' } },
        /Inference-Header-Content-Length must be a non-negative integer/,
      ],
      [
        'a fractional header length',
        { ...binaryRequest(header([]), []), headers: { ...AUTH, 'inference-header-content-length': '1.5' } },
        /Inference-Header-Content-Length must be a non-negative integer/,
      ],
      [
        'a header length past the body',
        { ...binaryRequest(header([]), []), headers: { ...AUTH, 'inference-header-content-length': '999' } },
        /Inference-Header-Content-Length is 999 but the body has only 13 bytes/,
      ],
      ['a header that is not JSON', binaryRequest(undefined, [], '{"inputs": ['), /malformed JSON inference header/],
      [
        'an empty header',
        {
          ...binaryRequest(undefined, [Buffer.alloc(4)], ''),
          headers: { ...AUTH, 'inference-header-content-length': '0' },
        },
        /inference header .*is empty/,
      ],
      [
        'bytes nobody claims',
        binaryRequest(header([f32('x', [1], 4)]), [Buffer.alloc(8)]),
        /8 bytes of binary tensor data.*input "x" add up to 4/,
      ],
      [
        'binary data without binary inputs',
        binaryRequest(header([{ name: 'x', shape: [1], datatype: 'FP32', data: [1] }]), [Buffer.alloc(4)]),
        /4 bytes of binary tensor data.*no input has a binary_data_size/,
      ],
      [
        'sizes past the end of the body',
        binaryRequest(header([f32('x', [1], 4), f32('y', [2], 8)]), [Buffer.alloc(8)]),
        /input "y": binary_data_size is 8 but only 4 bytes/,
      ],
      [
        'a size the shape does not need',
        binaryRequest(header([f32('x', [2], 4), f32('y', [1], 4)]), [Buffer.alloc(8)]),
        /input "x": binary_data_size is 4 but shape \[2\] of FP32 needs 8 bytes/,
      ],
      [
        'a negative size',
        binaryRequest(header([f32('x', [0], -4)]), []),
        /input "x": parameter "binary_data_size" must be a non-negative integer/,
      ],
      [
        'a fractional size',
        binaryRequest(header([f32('x', [1], 4.5)]), [Buffer.alloc(4)]),
        /input "x": parameter "binary_data_size" must be a non-negative integer/,
      ],
      [
        'a size as a string',
        binaryRequest(header([f32('x', [1], '4')]), [Buffer.alloc(4)]),
        /input "x": parameter "binary_data_size" must be a non-negative integer/,
      ],
      [
        'both data and a size',
        binaryRequest(header([{ ...f32('x', [1], 4), data: [1] }]), [Buffer.alloc(4)]),
        /input "x" has both "data" and a binary_data_size/,
      ],
      [
        'a broken BYTES length prefix',
        binaryRequest(header([{ name: 's', shape: [1], datatype: 'BYTES', parameters: { binary_data_size: 6 } }]), [
          Buffer.from([9, 0, 0, 0, 0x61, 0x62]),
        ]),
        /input "s": BYTES data has a broken 4-byte length prefix/,
      ],
      [
        'too few BYTES elements',
        binaryRequest(header([{ name: 's', shape: [2], datatype: 'BYTES', parameters: { binary_data_size: 6 } }]), [
          Buffer.from([2, 0, 0, 0, 0x61, 0x62]),
        ]),
        /input "s" has 1 BYTES elements but shape \[2\] needs 2/,
      ],
      [
        'a BYTES element with a NUL byte',
        binaryRequest(header([{ name: 's', shape: [1], datatype: 'BYTES', parameters: { binary_data_size: 6 } }]), [
          Buffer.from([2, 0, 0, 0, 0x61, 0]),
        ]),
        /input "s": BYTES element 0 contains a NUL byte/,
      ],
      [
        'a non-boolean binary_data_output',
        binaryRequest({ inputs: [f32('x', [1], 4)], parameters: { binary_data_output: 1 } }, [Buffer.alloc(4)]),
        /parameter "binary_data_output" must be a boolean/,
      ],
      [
        'a non-boolean binary_data',
        binaryRequest({ inputs: [f32('x', [1], 4)], outputs: [{ name: 'x', parameters: { binary_data: 'yes' } }] }, [
          Buffer.alloc(4),
        ]),
        /output "x": parameter "binary_data" must be a boolean/,
      ],
    ])('answers 400 naming the problem to %s, and asks the router nothing', async (_label, request, message) => {
      const reply = await postBinary(request);
      expect(reply.status).toBe(400);
      expect((reply.json as { error: string }).error).toMatch(message);
      expect(routed()).toEqual([]);
    });

    it('refuses a binary_data_size on an input of a JSON request without the header', async () => {
      const reply = await postJson({ inputs: [f32('x', [1], 4)] });
      expect(reply.status).toBe(400);
      expect((reply.json as { error: string }).error).toMatch(
        /input "x" has a binary_data_size parameter, but the request has no Inference-Header-Content-Length/,
      );
    });

    it('answers 413 to a binary body over GATEWAY_MAX_BODY_BYTES, counting the binary data', async () => {
      const request = binaryRequest(header([f32('x', [MAX_BODY_BYTES / 4], MAX_BODY_BYTES)]), [
        Buffer.alloc(MAX_BODY_BYTES),
      ]);
      const reply = await postBinary(request);
      expect(reply.status).toBe(413);
      expect(reply.json).toEqual({ error: expect.stringContaining(String(MAX_BODY_BYTES)) });
    });

    it('refuses the header on routes that are not inference', async () => {
      const reply = await postBinary(binaryRequest({ ready: true }, []), '/v2/repository/index');
      expect(reply.status).toBe(400);
      expect((reply.json as { error: string }).error).toMatch(/for inference requests only/);
    });
  });

  describe('JSON values out of range', () => {
    it.each([
      [
        '"NaN" for FP32',
        '{"name":"x","shape":[1],"datatype":"FP32","data":["NaN"]}',
        /input "x": element 0 \("NaN"\) is not a finite number/,
      ],
      [
        '"Infinity" for FP64',
        '{"name":"x","shape":[1],"datatype":"FP64","data":["Infinity"]}',
        /input "x": element 0 \("Infinity"\) is not a finite number/,
      ],
      [
        '1e999 for FP64',
        '{"name":"x","shape":[1],"datatype":"FP64","data":[1e999]}',
        /input "x": element 0 \(Infinity\) is not a finite number/,
      ],
      [
        '1e39 for FP32',
        '{"name":"x","shape":[1],"datatype":"FP32","data":[1e39]}',
        /input "x": element 0 \(1e\+39\) is not within the FP32 range/,
      ],
      [
        '65520 for FP16',
        '{"name":"x","shape":[1],"datatype":"FP16","data":[65520]}',
        /input "x": element 0 \(65520\) is not within the FP16 range/,
      ],
      [
        '256 for UINT8',
        '{"name":"x","shape":[1],"datatype":"UINT8","data":[256]}',
        /input "x": element 0 \(256\) is not an integer in the UINT8 range \[0, 255\]/,
      ],
      [
        '-1 for UINT32',
        '{"name":"x","shape":[1],"datatype":"UINT32","data":[-1]}',
        /input "x": element 0 \(-1\) is not an integer in the UINT32 range/,
      ],
      [
        '2^63 for INT64 as a string',
        '{"name":"x","shape":[1],"datatype":"INT64","data":["9223372036854775808"]}',
        /input "x": element 0 \("9223372036854775808"\) is not an integer in the INT64 range/,
      ],
      [
        '2^63 for INT64 as a number',
        '{"name":"x","shape":[1],"datatype":"INT64","data":[9223372036854775808]}',
        /input "x": element 0 \(9223372036854776000\) is not an integer in the INT64 range/,
      ],
      [
        '1.5 for INT32',
        '{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}',
        /input "x": element 0 \(1.5\) is not an integer in the INT32 range/,
      ],
    ])('answers 400 naming the input to %s', async (_label, input, message) => {
      const reply = await postJson(`{"inputs":[${input}]}`);
      expect(reply.status).toBe(400);
      expect((reply.json as { error: string }).error).toMatch(message);
    });

    it('answers 400 to a bare NaN or Infinity, which JSON does not have', async () => {
      for (const value of ['NaN', 'Infinity', '-Infinity']) {
        const reply = await postJson(`{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[${value}]}]}`);
        expect([reply.status, value]).toEqual([400, value]);
        expect((reply.json as { error: string }).error).toMatch(/malformed JSON body/);
      }
    });
  });
});
