import { datatypeFromName, jsonToRaw } from '@infermesh/tensors';
import { API_KEY, type Fixture, startFixture } from './support/system-fixture';
import { kserveClient } from './support/kserve-grpc-client';

/**
 * Every KServe datatype through the whole system (gateway, router, batcher, worker, onnxruntime-node
 * and back) on the `identity` demo model: one Identity per datatype, "<type>_in" -> "<type>_out". Each
 * request carries the datatype under test with values at its range edges, and every other input empty
 * ([0, 0]), so a test fails only for its own datatype and path.
 */

const le = (view: ArrayBufferView) => Buffer.from(view.buffer, view.byteOffset, view.byteLength);

/** BYTES elements in the KServe raw layout: each a 4-byte little-endian length, then its bytes. */
function lengthPrefixed(elements: readonly Buffer[]): Buffer {
  return Buffer.concat(elements.flatMap((e) => [le(Uint32Array.of(e.length)), e]));
}

const utf8 = (strings: readonly string[]) => strings.map((s) => Buffer.from(s, 'utf8'));

interface DatatypeCase {
  /** The tensor's shape; the data below has as many elements. */
  shape: [number, number];
  /** Values sent as REST JSON, which come back exactly as they were sent. */
  json: unknown[];
  /** Bytes sent in raw_input_contents, which come back bit for bit. */
  raw: Buffer;
  /** The InferTensorContents field, its values as @grpc/proto-loader takes them, and their raw bytes; none for FP16. */
  typed?: { field: string; values: unknown[]; raw: Buffer };
}

const INT64_EDGES = [-(2n ** 63n), -(2n ** 53n) - 1n, -1n, 0n, 2n ** 53n + 1n, 2n ** 63n - 1n];
const UINT64_EDGES = [0n, 1n, 2n ** 53n - 1n, 2n ** 53n + 1n, 2n ** 63n, 2n ** 64n - 1n];
const FP64_EDGES = [1e300, -1e-300, 5e-324, -1.7976931348623157e308, 0.1, 3.141592653589793];
const FP32_EDGES = [
  3.4028234663852886e38,
  -1.401298464324817e-45,
  1.1754943508222875e-38,
  -0,
  0.10000000149011612,
  Infinity,
  16777216,
  -1.5,
];
const BYTES_EDGES = ['héllo wörld', '', '日本語', '🙂'];

const CASES: Record<string, DatatypeCase> = {
  BOOL: {
    shape: [2, 2],
    json: [true, false, false, true],
    raw: Buffer.from([1, 0, 0, 1]),
    typed: { field: 'bool_contents', values: [true, false, false, true], raw: Buffer.from([1, 0, 0, 1]) },
  },
  UINT8: {
    shape: [2, 2],
    json: [0, 1, 254, 255],
    raw: Buffer.from([0, 1, 254, 255]),
    typed: { field: 'uint_contents', values: [0, 1, 254, 255], raw: Buffer.from([0, 1, 254, 255]) },
  },
  UINT16: {
    shape: [2, 2],
    json: [0, 1, 65534, 65535],
    raw: le(Uint16Array.of(0, 1, 65534, 65535)),
    typed: { field: 'uint_contents', values: [0, 1, 65534, 65535], raw: le(Uint16Array.of(0, 1, 65534, 65535)) },
  },
  UINT32: {
    shape: [2, 2],
    json: [0, 1, 4294967294, 4294967295],
    raw: le(Uint32Array.of(0, 1, 4294967294, 4294967295)),
    typed: {
      field: 'uint_contents',
      values: [0, 1, 4294967294, 4294967295],
      raw: le(Uint32Array.of(0, 1, 4294967294, 4294967295)),
    },
  },
  UINT64: {
    shape: [2, 3],
    // README: 64-bit integers beyond ±2^53 travel in JSON as decimal strings, both ways.
    json: [0, 1, 9007199254740991, '9007199254740993', '9223372036854775808', '18446744073709551615'],
    raw: le(BigUint64Array.from(UINT64_EDGES)),
    typed: { field: 'uint64_contents', values: UINT64_EDGES.map(String), raw: le(BigUint64Array.from(UINT64_EDGES)) },
  },
  INT8: {
    shape: [2, 2],
    json: [-128, -1, 0, 127],
    raw: le(Int8Array.of(-128, -1, 0, 127)),
    typed: { field: 'int_contents', values: [-128, -1, 0, 127], raw: le(Int8Array.of(-128, -1, 0, 127)) },
  },
  INT16: {
    shape: [2, 2],
    json: [-32768, -1, 0, 32767],
    raw: le(Int16Array.of(-32768, -1, 0, 32767)),
    typed: { field: 'int_contents', values: [-32768, -1, 0, 32767], raw: le(Int16Array.of(-32768, -1, 0, 32767)) },
  },
  INT32: {
    shape: [2, 2],
    json: [-2147483648, -1, 0, 2147483647],
    raw: le(Int32Array.of(-2147483648, -1, 0, 2147483647)),
    typed: {
      field: 'int_contents',
      values: [-2147483648, -1, 0, 2147483647],
      raw: le(Int32Array.of(-2147483648, -1, 0, 2147483647)),
    },
  },
  INT64: {
    shape: [2, 3],
    json: ['-9223372036854775808', '-9007199254740993', -1, 0, '9007199254740993', '9223372036854775807'],
    raw: le(BigInt64Array.from(INT64_EDGES)),
    typed: { field: 'int64_contents', values: INT64_EDGES.map(String), raw: le(BigInt64Array.from(INT64_EDGES)) },
  },
  FP16: {
    shape: [2, 4],
    // The largest finite, halves, the smallest subnormal and normal, and 0.1 (written back as 0.1, not 0.0999755859375).
    json: [65504, -65504, 0.5, -2.5, 6e-8, 0.00006104, 0.1, 1],
    // 65504, -65504, 0.5, smallest subnormal, smallest normal, -0, +Infinity, a NaN.
    raw: le(Uint16Array.of(0x7bff, 0xfbff, 0x3800, 0x0001, 0x0400, 0x8000, 0x7c00, 0x7e00)),
  },
  FP32: {
    shape: [2, 4],
    json: [3.4028235e38, -3.4028235e38, 1.1754944e-38, 1.4013e-45, 0.1, 16777216, -1.5, 1e-10],
    raw: le(
      Float32Array.of(3.4028234663852886e38, -Infinity, NaN, 1.401298464324817e-45, -0, 0.1, 1.1754943508222875e-38, 1),
    ),
    typed: { field: 'fp32_contents', values: FP32_EDGES, raw: le(Float32Array.from(FP32_EDGES)) },
  },
  FP64: {
    shape: [2, 3],
    // None of these fits FP32.
    json: FP64_EDGES,
    raw: le(Float64Array.of(1e300, -Infinity, NaN, 5e-324, -0, 0.1)),
    typed: { field: 'fp64_contents', values: FP64_EDGES, raw: le(Float64Array.from(FP64_EDGES)) },
  },
  BYTES: {
    shape: [2, 2],
    json: BYTES_EDGES,
    raw: lengthPrefixed(utf8(BYTES_EDGES)),
    typed: { field: 'bytes_contents', values: utf8(BYTES_EDGES), raw: lengthPrefixed(utf8(BYTES_EDGES)) },
  },
};

const DATATYPES = Object.keys(CASES);
const inputName = (datatype: string) => `${datatype.toLowerCase()}_in`;
const outputName = (datatype: string) => `${datatype.toLowerCase()}_out`;

interface JsonResponse {
  parameters: Record<string, unknown>;
  outputs: { name: string; datatype: string; shape: number[]; data: unknown[] }[];
}

interface GrpcResponse {
  parameters: Record<string, { bool_param?: boolean }>;
  outputs: { name: string; datatype: string; shape: string[] }[];
  raw_output_contents: Buffer[];
}

describe('every datatype through the whole system', () => {
  let fixture: Fixture;
  let url: string;
  let grpcClient: ReturnType<typeof kserveClient>;

  const postInfer = (body: unknown) =>
    fetch(`${url}/v2/models/identity/infer`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
      body: JSON.stringify(body),
    });

  /** The model's inputs: `given` by name, every other one empty. */
  const jsonInputs = (given: Record<string, unknown>[]) =>
    DATATYPES.map(
      (d) =>
        given.find((t) => t['name'] === inputName(d)) ?? { name: inputName(d), datatype: d, shape: [0, 0], data: [] },
    ).concat(given.filter((t) => !DATATYPES.some((d) => t['name'] === inputName(d))));

  const grpcInputs = (given: { name: string; datatype: string; shape: number[]; contents?: object }[]) => {
    const empty = DATATYPES.filter((d) => !given.some((t) => t.name === inputName(d))).map((d) => ({
      name: inputName(d),
      datatype: d,
      shape: [0, 0],
    }));
    return [...given, ...empty];
  };

  const modelInfer = (request: object) =>
    grpcClient.call<GrpcResponse>('ModelInfer', { model_name: 'identity', ...request }, API_KEY);

  beforeAll(async () => {
    // Without the result cache, each request is run by the worker, not answered from an earlier one.
    fixture = await startFixture({ models: ['identity'], env: { ROUTER_CACHE_ENABLED: 'false' } });
    url = fixture.system.gatewayUrl;
    grpcClient = kserveClient(fixture.system.gatewayGrpcAddress);
  });

  afterAll(async () => {
    grpcClient?.close();
    await fixture?.stop();
  });

  describe.each(DATATYPES)('%s', (datatype) => {
    const c = CASES[datatype]!;
    const name = inputName(datatype);

    it('comes back exactly over REST JSON', async () => {
      const res = await postInfer({ inputs: jsonInputs([{ name, datatype, shape: c.shape, data: c.json }]) });
      const body = (await res.json()) as JsonResponse;
      expect({ status: res.status, body }).toMatchObject({ status: 200 });
      expect(body.parameters['cached']).toBe(false);
      expect(body.outputs).toHaveLength(DATATYPES.length);
      expect(body.outputs.find((o) => o.name === outputName(datatype))).toEqual({
        name: outputName(datatype),
        datatype,
        shape: c.shape,
        data: c.json,
      });
    });

    it('comes back over REST binary data bit for bit, the same as its JSON round trip', async () => {
      const type = datatypeFromName(datatype)!;
      // The JSON values as raw bytes: what the binary request sends in their place.
      const sent = jsonToRaw(name, type, c.json, c.json.length);
      const header = Buffer.from(
        JSON.stringify({
          inputs: DATATYPES.map((d) => ({
            name: inputName(d),
            datatype: d,
            shape: d === datatype ? c.shape : [0, 0],
            parameters: { binary_data_size: d === datatype ? sent.length : 0 },
          })),
          outputs: [{ name: outputName(datatype), parameters: { binary_data: true } }],
        }),
      );
      const res = await fetch(`${url}/v2/models/identity/infer`, {
        method: 'POST',
        headers: {
          'content-type': 'application/octet-stream',
          'inference-header-content-length': String(header.length),
          authorization: `Bearer ${API_KEY}`,
        },
        body: Buffer.concat([header, sent]),
      });
      const body = Buffer.from(await res.arrayBuffer());
      expect({ status: res.status, text: res.status === 200 ? '' : body.toString() }).toEqual({
        status: 200,
        text: '',
      });
      const headerLength = Number(res.headers.get('inference-header-content-length'));
      const answer = JSON.parse(body.subarray(0, headerLength).toString()) as { outputs: unknown[] };
      expect(answer.outputs).toEqual([
        { name: outputName(datatype), datatype, shape: c.shape, parameters: { binary_data_size: sent.length } },
      ]);
      const binary = body.subarray(headerLength);

      const json = (await (
        await postInfer({ inputs: jsonInputs([{ name, datatype, shape: c.shape, data: c.json }]) })
      ).json()) as JsonResponse;
      const jsonData = json.outputs.find((o) => o.name === outputName(datatype))!.data;

      expect(binary.equals(sent)).toBe(true);
      expect(binary.equals(jsonToRaw(outputName(datatype), type, jsonData, jsonData.length))).toBe(true);
    });

    it('comes back bit for bit over gRPC raw contents', async () => {
      const inputs = grpcInputs([{ name, datatype, shape: c.shape }]);
      const response = await modelInfer({
        inputs,
        raw_input_contents: inputs.map((t) => (t.name === name ? c.raw : Buffer.alloc(0))),
      });
      const i = response.outputs.findIndex((o) => o.name === outputName(datatype));
      expect(response.outputs[i]).toMatchObject({ datatype, shape: c.shape.map(String) });
      expect(response.raw_output_contents[i]!.toString('hex')).toBe(c.raw.toString('hex'));
      expect(response.parameters['cached']?.bool_param).toBe(false);
    });

    if (c.typed !== undefined) {
      const typed = c.typed;
      it(`comes back exactly from typed ${typed.field}`, async () => {
        const response = await modelInfer({
          inputs: grpcInputs([{ name, datatype, shape: c.shape, contents: { [typed.field]: typed.values } }]),
        });
        const i = response.outputs.findIndex((o) => o.name === outputName(datatype));
        expect(response.outputs[i]).toMatchObject({ datatype, shape: c.shape.map(String) });
        expect(response.raw_output_contents[i]!.toString('hex')).toBe(typed.raw.toString('hex'));
      });
    } else {
      it('is refused in typed contents, which KServe v2 has no field for, with INVALID_ARGUMENT pointing to raw contents', async () => {
        await expect(
          modelInfer({
            inputs: grpcInputs([
              { name, datatype, shape: c.shape, contents: { fp32_contents: [0.5, 1, 2, 3, 4, 5, 6, 7] } },
            ]),
          }),
        ).rejects.toMatchObject({
          code: 3,
          details: expect.stringMatching(
            new RegExp(`input "${name}": ${datatype} has no typed contents field.*raw_input_contents`),
          ),
        });
      });
    }
  });

  describe('BYTES elements that onnxruntime-node would alter', () => {
    it('are refused over REST with 400 rather than cut short at a NUL byte', async () => {
      const res = await postInfer({
        inputs: jsonInputs([{ name: 'bytes_in', datatype: 'BYTES', shape: [1, 2], data: ['ok', 'a\u0000b'] }]),
      });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: string }).error).toMatch(
        /input "bytes_in": BYTES element 1 contains a NUL byte/,
      );
    });

    it('are refused over gRPC with INVALID_ARGUMENT rather than turned into U+FFFD when not UTF-8', async () => {
      const inputs = grpcInputs([{ name: 'bytes_in', datatype: 'BYTES', shape: [1, 1] }]);
      await expect(
        modelInfer({
          inputs,
          raw_input_contents: inputs.map((t) =>
            t.name === 'bytes_in' ? lengthPrefixed([Buffer.from([0x41, 0xff])]) : Buffer.alloc(0),
          ),
        }),
      ).rejects.toMatchObject({
        code: 3,
        details: expect.stringMatching(/input "bytes_in": BYTES element 0 is not valid UTF-8/),
      });
    });
  });

  describe('BF16, which onnxruntime-node cannot hold', () => {
    const bf16 = { name: 'bf16_in', datatype: 'BF16', shape: [1, 2] };
    const refusal = /input "bf16_in" has datatype BF16, which infermesh cannot serve/;

    it('is refused over REST with 501 naming the tensor and the datatype', async () => {
      const res = await postInfer({ inputs: jsonInputs([{ ...bf16, data: [1.5, -2] }]) });
      expect(res.status).toBe(501);
      expect(((await res.json()) as { error: string }).error).toMatch(refusal);
    });

    it('is refused over gRPC raw contents with UNIMPLEMENTED naming the tensor and the datatype', async () => {
      const inputs = grpcInputs([bf16]);
      await expect(
        modelInfer({
          inputs,
          raw_input_contents: inputs.map((t) =>
            t.name === 'bf16_in' ? Buffer.from([0xc0, 0x3f, 0x00, 0xc0]) : Buffer.alloc(0),
          ),
        }),
      ).rejects.toMatchObject({ code: 12, details: expect.stringMatching(refusal) });
    });

    it('is refused over gRPC typed contents with UNIMPLEMENTED naming the tensor and the datatype', async () => {
      await expect(
        modelInfer({ inputs: grpcInputs([{ ...bf16, contents: { fp32_contents: [1.5, -2] } }]) }),
      ).rejects.toMatchObject({
        code: 12,
        details: expect.stringMatching(refusal),
      });
    });
  });
});
