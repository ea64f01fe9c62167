import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { thrownBy } from '@infermesh/testing';
import { ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { DataType, InferenceResponseSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { inferRequestFromGrpc, inferResponseToGrpc } from './grpc-codec';

type Init = Parameters<typeof create<typeof ModelInferRequestSchema>>[1];
const request = (init: Init) => create(ModelInferRequestSchema, { modelName: 'm', ...init });
const typed = (datatype: string, shape: bigint[], contents: Record<string, unknown>) =>
  inferRequestFromGrpc(request({ inputs: [{ name: 't', datatype, shape, contents }] })).inputs[0]!;
const bytes = (view: ArrayBufferView) => [...new Uint8Array(view.buffer, view.byteOffset, view.byteLength)];

describe('gRPC ModelInfer <-> internal tensors', () => {
  it.each([
    ['BOOL', { boolContents: [true, false] }, [1, 0]],
    ['INT8', { intContents: [-1, 127] }, bytes(Int8Array.from([-1, 127]))],
    ['INT16', { intContents: [-300, 300] }, bytes(Int16Array.from([-300, 300]))],
    ['INT32', { intContents: [-70000, 70000] }, bytes(Int32Array.from([-70000, 70000]))],
    ['INT64', { int64Contents: [-1n, 2n ** 62n] }, bytes(BigInt64Array.from([-1n, 2n ** 62n]))],
    ['UINT8', { uintContents: [0, 255] }, [0, 255]],
    ['UINT16', { uintContents: [1, 65535] }, bytes(Uint16Array.from([1, 65535]))],
    ['UINT32', { uintContents: [1, 4294967295] }, bytes(Uint32Array.from([1, 4294967295]))],
    ['UINT64', { uint64Contents: [1n, 2n ** 64n - 1n] }, bytes(BigUint64Array.from([1n, 2n ** 64n - 1n]))],
    ['FP32', { fp32Contents: [1.5, -2] }, bytes(Float32Array.from([1.5, -2]))],
    ['FP64', { fp64Contents: [0.1, -3] }, bytes(Float64Array.from([0.1, -3]))],
    ['BYTES', { bytesContents: [Buffer.from('hi'), Buffer.alloc(0)] }, [2, 0, 0, 0, 0x68, 0x69, 0, 0, 0, 0]],
  ])('converts typed %s contents to raw little-endian bytes', (datatype, contents, expected) => {
    const sut = typed(datatype, [2n], contents);
    expect([...sut.data]).toEqual(expected);
    expect(sut.shape).toEqual([2n]);
  });

  it('takes raw_input_contents as they are, one per input in order', () => {
    const sut = inferRequestFromGrpc(
      request({
        modelVersion: '4',
        id: 'x',
        inputs: [
          { name: 'a', datatype: 'FP16', shape: [1n, 2n] },
          { name: 'b', datatype: 'BYTES', shape: [1n] },
        ],
        outputs: [{ name: 'y' }],
        rawInputContents: [Buffer.from([0, 0x3c, 0, 0xc0]), Buffer.from([1, 0, 0, 0, 0x7a])],
      }),
    );
    expect(sut).toMatchObject({ modelName: 'm', modelVersion: '4', id: 'x', outputNames: ['y'] });
    expect(sut.inputs.map((t) => [t.name, t.datatype, [...t.data]])).toEqual([
      ['a', DataType.FP16, [0, 0x3c, 0, 0xc0]],
      ['b', DataType.BYTES, [1, 0, 0, 0, 0x7a]],
    ]);
  });

  const refusal = (init: Init): RpcError => thrownBy(() => inferRequestFromGrpc(request(init)), RpcError);

  it.each<[string, Init, RegExp]>([
    ['no model name', { modelName: '', inputs: [{ name: 'a', datatype: 'FP32', shape: [0n] }] }, /model_name/],
    [
      'raw contents for only some inputs',
      {
        inputs: [
          { name: 'a', datatype: 'FP32', shape: [0n] },
          { name: 'b', datatype: 'FP32', shape: [0n] },
        ],
        rawInputContents: [new Uint8Array()],
      },
      /raw_input_contents has 1 entries.*2 inputs/,
    ],
    [
      'raw contents of the wrong length',
      { inputs: [{ name: 'a', datatype: 'FP32', shape: [2n] }], rawInputContents: [new Uint8Array(4)] },
      /input "a" has 4 bytes.*needs 8/,
    ],
    [
      'broken BYTES raw contents',
      { inputs: [{ name: 'a', datatype: 'BYTES', shape: [1n] }], rawInputContents: [new Uint8Array([9, 0, 0, 0, 1])] },
      /input "a".*length prefix/,
    ],
    [
      'typed and raw contents mixed',
      {
        inputs: [{ name: 'a', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
        rawInputContents: [new Uint8Array(4)],
      },
      /input "a".*every input must be raw/,
    ],
    [
      'the wrong contents field',
      { inputs: [{ name: 'a', datatype: 'FP32', shape: [1n], contents: { fp64Contents: [1] } }] },
      /input "a".*fp32_contents.*fp64_contents/,
    ],
    [
      'too few typed elements',
      { inputs: [{ name: 'a', datatype: 'INT32', shape: [2n, 2n], contents: { intContents: [1, 2, 3] } }] },
      /input "a": int_contents has 3 elements.*needs 4/,
    ],
    [
      'an INT8 out of range',
      { inputs: [{ name: 'a', datatype: 'INT8', shape: [1n], contents: { intContents: [200] } }] },
      /input "a".*INT8 range/,
    ],
    [
      'a UINT16 out of range',
      { inputs: [{ name: 'a', datatype: 'UINT16', shape: [1n], contents: { uintContents: [70000] } }] },
      /input "a".*UINT16 range/,
    ],
    [
      'typed FP16 without contents',
      { inputs: [{ name: 'a', datatype: 'FP16', shape: [1n], contents: {} }] },
      /input "a": FP16 has no typed contents field.*raw_input_contents/,
    ],
    [
      'typed FP16 in fp32_contents',
      { inputs: [{ name: 'a', datatype: 'FP16', shape: [1n], contents: { fp32Contents: [0.5] } }] },
      /input "a": FP16 has no typed contents field.*raw_input_contents/,
    ],
    [
      'an empty FP16 with typed contents',
      { inputs: [{ name: 'a', datatype: 'FP16', shape: [0n], contents: { fp32Contents: [0.5] } }] },
      /input "a": FP16 has no typed contents field/,
    ],
    [
      'an unknown datatype',
      { inputs: [{ name: 'a', datatype: 'COMPLEX64', shape: [1n] }] },
      /input "a".*unknown datatype/,
    ],
    [
      'raw BYTES that are not UTF-8',
      {
        inputs: [{ name: 'a', datatype: 'BYTES', shape: [2n] }],
        rawInputContents: [new Uint8Array([1, 0, 0, 0, 0x61, 1, 0, 0, 0, 0xff])],
      },
      /input "a": BYTES element 1 is not valid UTF-8/,
    ],
    [
      'typed BYTES with a NUL byte',
      {
        inputs: [{ name: 'a', datatype: 'BYTES', shape: [1n], contents: { bytesContents: [Buffer.from('a\u0000b')] } }],
      },
      /input "a": BYTES element 0 contains a NUL byte/,
    ],
    [
      'a negative dimension',
      { inputs: [{ name: 'a', datatype: 'FP32', shape: [-1n], contents: {} }] },
      /input "a".*dimension -1/,
    ],
    [
      'no data for a non-empty shape',
      { inputs: [{ name: 'a', datatype: 'FP32', shape: [3n] }] },
      /input "a": fp32_contents has 0 elements.*needs 3/,
    ],
    [
      'a duplicate input',
      {
        inputs: [
          { name: 'a', datatype: 'FP32', shape: [0n] },
          { name: 'a', datatype: 'FP32', shape: [0n] },
        ],
      },
      /input "a".*more than once/,
    ],
  ])('refuses %s with INVALID_ARGUMENT naming the tensor', (_label, init, message) => {
    const error = refusal(init);
    expect(error).toBeInstanceOf(RpcError);
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(message);
  });

  it('takes an FP16 tensor without elements in a typed request, since it has no data to carry', () => {
    const sut = inferRequestFromGrpc(
      request({
        inputs: [
          { name: 'a', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [2] } },
          { name: 'h', datatype: 'FP16', shape: [2n, 0n] },
        ],
      }),
    );
    expect(sut.inputs.map((t) => [t.name, t.datatype, t.shape, [...t.data]])).toEqual([
      ['a', DataType.FP32, [1n], bytes(Float32Array.from([2]))],
      ['h', DataType.FP16, [2n, 0n], []],
    ]);
  });

  it.each<[string, Init]>([
    [
      'raw',
      { inputs: [{ name: 'b', datatype: 'BF16', shape: [1n] }], rawInputContents: [new Uint8Array([0x80, 0x3f])] },
    ],
    ['typed', { inputs: [{ name: 'b', datatype: 'BF16', shape: [1n], contents: { fp32Contents: [1] } }] }],
  ])('refuses a %s BF16 input with UNIMPLEMENTED naming the tensor and the datatype', (_label, init) => {
    const error = refusal(init);
    expect(error).toBeInstanceOf(RpcError);
    expect(error.code).toBe(status.UNIMPLEMENTED);
    expect(error.reason).toBe('DATATYPE_UNSUPPORTED');
    expect(error.message).toMatch(/input "b" has datatype BF16, which infermesh cannot serve/);
  });

  it('answers with raw output contents, output metadata, the served version and the flags', () => {
    const sut = inferResponseToGrpc(
      create(InferenceResponseSchema, {
        modelName: 'm',
        modelVersion: '5',
        id: 'i',
        degraded: true,
        outputs: [{ name: 'y', datatype: DataType.INT64, shape: [1n], data: new Uint8Array(8) }],
      }),
    );
    expect(sut).toMatchObject({
      modelName: 'm',
      modelVersion: '5',
      id: 'i',
      outputs: [{ name: 'y', datatype: 'INT64', shape: [1n] }],
    });
    expect(sut.rawOutputContents).toEqual([new Uint8Array(8)]);
    expect(sut.parameters?.['degraded']?.parameterChoice).toEqual({ case: 'boolParam', value: true });
    expect(sut.parameters?.['cached']?.parameterChoice).toEqual({ case: 'boolParam', value: false });
  });
});
