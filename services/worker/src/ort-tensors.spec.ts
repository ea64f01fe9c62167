import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { buildIdentityModel } from '@infermesh/model-builder';
import { RpcError } from '@infermesh/grpc';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, datatypeName, decodeBytesElements, encodeBytesElements, toHalfBits } from '@infermesh/tensors';
import { ThreadsModelRuntime } from './model-runtime.threads';
import { fromWireTensor, toWireTensor, type WireTensor } from './ort-tensors';

const le = (array: ArrayBufferView) => Buffer.from(array.buffer, array.byteOffset, array.byteLength);

/** Two rows of three elements of each datatype, including each type's edge values, as raw bytes. */
const SAMPLES: Record<string, { datatype: DataType; ort: string; data: Buffer; values: unknown[] }> = {
  BOOL: { datatype: DataType.BOOL, ort: 'bool', data: le(Uint8Array.of(1, 0, 1, 1, 0, 0)), values: [1, 0, 1, 1, 0, 0] },
  UINT8: {
    datatype: DataType.UINT8,
    ort: 'uint8',
    data: le(Uint8Array.of(0, 1, 127, 128, 254, 255)),
    values: [0, 1, 127, 128, 254, 255],
  },
  INT8: {
    datatype: DataType.INT8,
    ort: 'int8',
    data: le(Int8Array.of(-128, -1, 0, 1, 100, 127)),
    values: [-128, -1, 0, 1, 100, 127],
  },
  UINT16: {
    datatype: DataType.UINT16,
    ort: 'uint16',
    data: le(Uint16Array.of(0, 1, 255, 256, 40000, 65535)),
    values: [0, 1, 255, 256, 40000, 65535],
  },
  INT16: {
    datatype: DataType.INT16,
    ort: 'int16',
    data: le(Int16Array.of(-32768, -1, 0, 1, 300, 32767)),
    values: [-32768, -1, 0, 1, 300, 32767],
  },
  UINT32: {
    datatype: DataType.UINT32,
    ort: 'uint32',
    data: le(Uint32Array.of(0, 1, 65536, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1)),
    values: [0, 1, 65536, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1],
  },
  INT32: {
    datatype: DataType.INT32,
    ort: 'int32',
    data: le(Int32Array.of(-(2 ** 31), -1, 0, 1, 123456, 2 ** 31 - 1)),
    values: [-(2 ** 31), -1, 0, 1, 123456, 2 ** 31 - 1],
  },
  UINT64: {
    datatype: DataType.UINT64,
    ort: 'uint64',
    data: le(BigUint64Array.of(0n, 1n, 2n ** 53n + 1n, 2n ** 63n, 2n ** 64n - 2n, 2n ** 64n - 1n)),
    values: [0n, 1n, 2n ** 53n + 1n, 2n ** 63n, 2n ** 64n - 2n, 2n ** 64n - 1n],
  },
  INT64: {
    datatype: DataType.INT64,
    ort: 'int64',
    data: le(BigInt64Array.of(-(2n ** 63n), -1n, 0n, 1n, 2n ** 53n + 1n, 2n ** 63n - 1n)),
    values: [-(2n ** 63n), -1n, 0n, 1n, 2n ** 53n + 1n, 2n ** 63n - 1n],
  },
  FP16: {
    datatype: DataType.FP16,
    ort: 'float16',
    data: le(Uint16Array.from([1, -2, 0.5, 65504, -0, 0.000061], toHalfBits)),
    values: [],
  },
  FP32: {
    datatype: DataType.FP32,
    ort: 'float32',
    data: le(Float32Array.of(1.5, -2.25, 0, 3.4e38, -1e-38, Math.PI)),
    values: [1.5, -2.25, 0, 3.4e38, -1e-38, Math.fround(Math.PI)].map(Math.fround),
  },
  FP64: {
    datatype: DataType.FP64,
    ort: 'float64',
    data: le(Float64Array.of(1.5, -2.25, 0, 1.7e308, -5e-324, Math.PI)),
    values: [1.5, -2.25, 0, 1.7e308, -5e-324, Math.PI],
  },
  BYTES: {
    datatype: DataType.BYTES,
    ort: 'string',
    data: encodeBytesElements(['', 'a', 'héllo', '日本', 'x'.repeat(300), 'tab\tnew\nline'].map((s) => Buffer.from(s))),
    values: ['', 'a', 'héllo', '日本', 'x'.repeat(300), 'tab\tnew\nline'],
  },
};

function tensor(name: string, datatype: DataType, data: Uint8Array, shape: bigint[] = [2n, 3n]): Tensor {
  return create(TensorSchema, { name, datatype, shape, data });
}

/** The same bytes at an odd offset inside a larger buffer, as a decoded protobuf field can be. */
function misaligned(data: Buffer): Uint8Array {
  const backing = Buffer.alloc(data.length + 1);
  data.copy(backing, 1);
  return backing.subarray(1);
}

/** The wire tensor's elements as the execution thread reads them. */
function elements(wire: WireTensor): ArrayLike<unknown> {
  if (wire.type === 'string') return decodeBytesElements(new Uint8Array(wire.data))!.map((b) => b.toString('utf8'));
  const arrays: Record<string, new (buffer: ArrayBuffer) => ArrayLike<unknown>> = {
    bool: Uint8Array,
    uint8: Uint8Array,
    int8: Int8Array,
    uint16: Uint16Array,
    int16: Int16Array,
    uint32: Uint32Array,
    int32: Int32Array,
    uint64: BigUint64Array,
    int64: BigInt64Array,
    float16: Uint16Array,
    float32: Float32Array,
    float64: Float64Array,
  };
  return new arrays[wire.type]!(wire.data);
}

describe('toWireTensor and fromWireTensor', () => {
  it.each(Object.keys(SAMPLES))('round-trips %s bytes and shape', (name) => {
    const sample = SAMPLES[name]!;
    const sut = toWireTensor(tensor('t', sample.datatype, sample.data));
    expect(sut.type).toBe(sample.ort);
    expect(sut.dims).toEqual([2, 3]);
    if (sample.values.length > 0) expect(Array.from(elements(sut))).toEqual(sample.values);
    const back = fromWireTensor(sut);
    expect(back.datatype).toBe(sample.datatype);
    expect(back.shape).toEqual([2n, 3n]);
    expect(Buffer.from(back.data).equals(sample.data)).toBe(true);
  });

  it.each(Object.keys(SAMPLES))('copies %s data that sits at an offset not aligned for its elements', (name) => {
    const sample = SAMPLES[name]!;
    const sut = toWireTensor(tensor('t', sample.datatype, misaligned(sample.data)));
    expect(sut.data.byteLength).toBe(sample.data.byteLength);
    const back = fromWireTensor(sut);
    expect(Buffer.from(back.data).equals(sample.data)).toBe(true);
  });

  it('refuses BF16, which onnxruntime-node cannot hold, with UNIMPLEMENTED naming the tensor', () => {
    try {
      toWireTensor(tensor('weights', DataType.BF16, Buffer.alloc(12)));
      throw new Error('accepted');
    } catch (error) {
      expect(error).toBeInstanceOf(RpcError);
      expect([(error as RpcError).code, (error as RpcError).reason]).toEqual([
        status.UNIMPLEMENTED,
        'DATATYPE_UNSUPPORTED',
      ]);
      expect((error as RpcError).message).toMatch(/"weights".*BF16/);
    }
  });

  it('refuses data whose length does not fit the shape', () => {
    try {
      toWireTensor(tensor('x', DataType.FP32, Buffer.alloc(20)));
      throw new Error('accepted');
    } catch (error) {
      expect(error).toBeInstanceOf(RpcError);
      expect((error as RpcError).code).toBe(status.INVALID_ARGUMENT);
      expect((error as RpcError).reason).toBe('INVALID_TENSOR');
    }
  });

  it("has BYTES data that does not hold the shape's elements refused by the session, naming the tensor", async () => {
    const session = await new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 1 }).load(
      buildIdentityModel(['BYTES']).bytes,
      ['cpu'],
    );
    try {
      const short = await session
        .run([tensor('bytes_in', DataType.BYTES, encodeBytesElements([Buffer.from('one')]))], [])
        .catch((e: unknown) => e);
      expect(short).toBeInstanceOf(RpcError);
      expect([(short as RpcError).code, (short as RpcError).reason]).toEqual([
        status.INVALID_ARGUMENT,
        'INVALID_TENSOR',
      ]);
      expect((short as RpcError).message).toMatch(/"bytes_in": BYTES data does not hold 6 length-prefixed elements/);
      const truncated = await session
        .run([tensor('bytes_in', DataType.BYTES, Buffer.from([5, 0, 0, 0, 65]), [1n, 1n])], [])
        .catch((e: unknown) => e);
      expect((truncated as RpcError).code).toBe(status.INVALID_ARGUMENT);
    } finally {
      await session.release();
    }
  });

  it('passes every datatype through a real session unchanged', async () => {
    const session = await new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 1 }).load(
      buildIdentityModel().bytes,
      ['cpu'],
    );
    const inputs = Object.values(SAMPLES).map((s) =>
      tensor(`${datatypeName(s.datatype).toLowerCase()}_in`, s.datatype, misaligned(s.data)),
    );
    const { outputs } = await session.run(inputs, []);
    expect(outputs).toHaveLength(Object.keys(SAMPLES).length);
    for (const output of outputs) {
      const name = datatypeName(output.datatype);
      expect(output.name).toBe(`${name.toLowerCase()}_out`);
      expect(output.shape).toEqual([2n, 3n]);
      expect(Buffer.from(output.data).equals(SAMPLES[name]!.data)).toBe(true);
    }
    await session.release();
  });
});
