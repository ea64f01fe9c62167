import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { thrownBy } from '@infermesh/testing';
import {
  DataType,
  InferenceResponseSchema,
  type InferenceRequest,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ALL_DATATYPES, datatypeName, UNSERVED_DATATYPES } from '@infermesh/tensors';
import { inferRequestFromJson, inferResponseToJson } from './rest-codec';

/** The request's tensors echoed back as a response, the way an identity model would answer. */
function echo(request: InferenceRequest) {
  return create(InferenceResponseSchema, {
    modelName: request.modelName,
    modelVersion: '1',
    id: request.id,
    outputs: request.inputs.map((t) => ({ name: t.name, datatype: t.datatype, shape: t.shape, data: t.data })),
  });
}

const SAMPLES: Record<string, { data: unknown[]; bytes: number[] }> = {
  BOOL: { data: [true, false], bytes: [1, 0] },
  UINT8: { data: [0, 255], bytes: [0, 255] },
  UINT16: { data: [1, 65535], bytes: [1, 0, 255, 255] },
  UINT32: { data: [1, 4294967295], bytes: [1, 0, 0, 0, 255, 255, 255, 255] },
  UINT64: {
    data: [1, '18446744073709551615'],
    bytes: [1, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255],
  },
  INT8: { data: [-128, 127], bytes: [128, 127] },
  INT16: { data: [-2, 32767], bytes: [254, 255, 255, 127] },
  INT32: { data: [-1, 2147483647], bytes: [255, 255, 255, 255, 255, 255, 255, 127] },
  INT64: {
    data: [-1, '9223372036854775807'],
    bytes: [255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 127],
  },
  FP16: { data: [1, -2], bytes: [0x00, 0x3c, 0x00, 0xc0] },
  FP32: { data: [1.5, -0.25], bytes: [...Buffer.from(Float32Array.from([1.5, -0.25]).buffer)] },
  FP64: { data: [0.1, -1e300], bytes: [...Buffer.from(Float64Array.from([0.1, -1e300]).buffer)] },
  BYTES: { data: ['ab', ''], bytes: [2, 0, 0, 0, 0x61, 0x62, 0, 0, 0, 0] },
};

describe('REST JSON <-> internal tensors', () => {
  const refusal = (body: unknown): RpcError => thrownBy(() => inferRequestFromJson('m', '', body), RpcError);

  it('covers every datatype that can be served', () => {
    const served = ALL_DATATYPES.filter((d) => !UNSERVED_DATATYPES.has(d.type));
    expect(Object.keys(SAMPLES).sort()).toEqual(served.map((d) => d.name).sort());
  });

  it('refuses a BF16 input with UNIMPLEMENTED naming the tensor and the datatype', () => {
    const error = refusal({ inputs: [{ name: 'b', shape: [1], datatype: 'BF16', data: [1] }] });
    expect(error).toBeInstanceOf(RpcError);
    expect(error.code).toBe(status.UNIMPLEMENTED);
    expect(error.message).toMatch(/input "b" has datatype BF16, which infermesh cannot serve/);
  });

  it('lists only the datatypes it serves when the datatype is unknown', () => {
    const error = refusal({ inputs: [{ name: 'a', shape: [1], datatype: 'F32', data: [1] }] });
    expect(error.message).toContain('FP64, BYTES');
    expect(error.message).not.toContain('BF16');
  });

  it.each(Object.entries(SAMPLES))('converts %s to raw little-endian bytes and back', (datatype, { data, bytes }) => {
    const sut = inferRequestFromJson('m', '', { inputs: [{ name: 't', shape: [2], datatype, data }] });
    expect([...sut.inputs[0]!.data]).toEqual(bytes);
    expect(datatypeName(sut.inputs[0]!.datatype)).toBe(datatype);
    expect(inferResponseToJson(echo(sut)).outputs[0]).toEqual({ name: 't', datatype, shape: [2], data });
  });

  it('flattens nested data row-major', () => {
    const sut = inferRequestFromJson('m', '', {
      inputs: [
        {
          name: 't',
          shape: [2, 2, 2],
          datatype: 'INT32',
          data: [
            [
              [1, 2],
              [3, 4],
            ],
            [
              [5, 6],
              [7, 8],
            ],
          ],
        },
      ],
    });
    expect(Array.from(new Int32Array(sut.inputs[0]!.data.slice().buffer))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(sut.inputs[0]!.shape).toEqual([2n, 2n, 2n]);
  });

  it('carries the model, version, id, outputs and parameters', () => {
    const sut = inferRequestFromJson('mlp', '7', {
      id: 'abc',
      inputs: [{ name: 't', shape: [0], datatype: 'FP32', data: [] }],
      outputs: [{ name: 'y' }, { name: 'z', parameters: { binary_data: true } }],
      parameters: { flag: true, n: 3, ratio: 0.5, s: 'x' },
    });
    expect(sut).toMatchObject({ modelName: 'mlp', modelVersion: '7', id: 'abc', outputNames: ['y', 'z'] });
    expect(Object.fromEntries(Object.entries(sut.parameters).map(([k, v]) => [k, v.parameterChoice]))).toEqual({
      flag: { case: 'boolParam', value: true },
      n: { case: 'int64Param', value: 3n },
      ratio: { case: 'doubleParam', value: 0.5 },
      s: { case: 'stringParam', value: 'x' },
    });
  });

  it('writes the response with its version, id, cached and degraded flags and parameters', () => {
    const response = create(InferenceResponseSchema, {
      modelName: 'm',
      modelVersion: '2',
      id: 'r',
      cached: true,
      parameters: { big: { parameterChoice: { case: 'uint64Param', value: 2n ** 60n } } },
      outputs: [
        { name: 'y', datatype: DataType.FP32, shape: [1n, 1n], data: Buffer.from(Float32Array.from([2]).buffer) },
      ],
    });
    expect(inferResponseToJson(response)).toEqual({
      model_name: 'm',
      model_version: '2',
      id: 'r',
      parameters: { big: String(2n ** 60n), cached: true, degraded: false },
      outputs: [{ name: 'y', datatype: 'FP32', shape: [1, 1], data: [2] }],
    });
  });

  it.each([
    ['a body that is not an object', [], /JSON object/],
    ['no inputs', {}, /"inputs"/],
    ['an input without a name', { inputs: [{ shape: [1], datatype: 'FP32', data: [1] }] }, /inputs\[0\].*"name"/],
    [
      'an unknown datatype',
      { inputs: [{ name: 'a', shape: [1], datatype: 'fp32', data: [1] }] },
      /input "a".*unknown datatype "fp32"/,
    ],
    [
      'a shape that is not an array',
      { inputs: [{ name: 'a', shape: 4, datatype: 'FP32', data: [1] }] },
      /input "a".*"shape"/,
    ],
    [
      'a fractional dimension',
      { inputs: [{ name: 'a', shape: [1.5], datatype: 'FP32', data: [1] }] },
      /input "a".*dimension 1.5/,
    ],
    [
      'a shape too large to count',
      { inputs: [{ name: 'a', shape: [2 ** 40, 2 ** 40], datatype: 'FP32', data: [] }] },
      /input "a".*too many elements/,
    ],
    [
      'more elements than the shape',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP32', data: [1, 2] }] },
      /input "a".*2 elements.*needs 1/,
    ],
    [
      'a NaN string',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP64', data: ['NaN'] }] },
      /input "a".*finite number/,
    ],
    [
      'an INT8 out of range',
      { inputs: [{ name: 'a', shape: [1], datatype: 'INT8', data: [128] }] },
      /input "a".*INT8 range/,
    ],
    [
      'an INT64 out of range',
      { inputs: [{ name: 'a', shape: [1], datatype: 'INT64', data: ['9223372036854775808'] }] },
      /input "a".*INT64 range/,
    ],
    [
      'an unsafe INT64 number',
      { inputs: [{ name: 'a', shape: [1], datatype: 'INT64', data: [2 ** 60] }] },
      /input "a".*INT64 range/,
    ],
    [
      'a negative UINT32',
      { inputs: [{ name: 'a', shape: [1], datatype: 'UINT32', data: [-1] }] },
      /input "a".*UINT32 range/,
    ],
    ['a number for BOOL', { inputs: [{ name: 'a', shape: [1], datatype: 'BOOL', data: [1] }] }, /input "a".*boolean/],
    ['a number for BYTES', { inputs: [{ name: 'a', shape: [1], datatype: 'BYTES', data: [1] }] }, /input "a".*string/],
    [
      'a BYTES string with a NUL',
      { inputs: [{ name: 'a', shape: [2], datatype: 'BYTES', data: ['ok', 'a\u0000b'] }] },
      /input "a": BYTES element 1 contains a NUL byte/,
    ],
    [
      'a BYTES string with a lone surrogate',
      { inputs: [{ name: 'a', shape: [1], datatype: 'BYTES', data: ['\ud83d'] }] },
      /input "a": element 0.*lone surrogate/,
    ],
    [
      'an FP16 out of range',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP16', data: [70000] }] },
      /input "a".*FP16 range/,
    ],
    [
      'a duplicate input',
      { inputs: [1, 2].map(() => ({ name: 'a', shape: [1], datatype: 'FP32', data: [1] })) },
      /input "a".*more than once/,
    ],
    [
      'shared memory',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP32', parameters: { shared_memory_region: 'r' } }] },
      /input "a".*shared memory/,
    ],
    [
      'an object parameter',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP32', data: [1] }], parameters: { p: [1] } },
      /parameter "p"/,
    ],
    [
      'an output without a name',
      { inputs: [{ name: 'a', shape: [1], datatype: 'FP32', data: [1] }], outputs: [{}] },
      /outputs\[0\]/,
    ],
  ])('refuses %s with INVALID_ARGUMENT and a message naming it', (_label, body, message) => {
    const error = refusal(body);
    expect(error).toBeInstanceOf(RpcError);
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(message);
  });
});
