import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { buildMultiIoModel, buildTinyModel, TINY_BIAS, TINY_WEIGHT } from '@infermesh/model-builder';
import { rpcRejection } from '@infermesh/testing';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType } from '@infermesh/tensors';
import { ModelLoadError } from './model-runtime';
import { OrtModelRuntime } from './model-runtime.ort';

const fp32 = (name: string, values: number[], shape: number[]): Tensor =>
  create(TensorSchema, { name, datatype: DataType.FP32, shape: shape.map(BigInt), data: Buffer.from(Float32Array.from(values).buffer) });
const int64 = (name: string, values: bigint[], shape: number[]): Tensor =>
  create(TensorSchema, { name, datatype: DataType.INT64, shape: shape.map(BigInt), data: Buffer.from(BigInt64Array.from(values).buffer) });
const floats = (t: Tensor) => Array.from(new Float32Array(Uint8Array.from(t.data).buffer));
const bigints = (t: Tensor) => Array.from(new BigInt64Array(Uint8Array.from(t.data).buffer));


describe(OrtModelRuntime.name, () => {
  const sut = new OrtModelRuntime({ intraOpThreads: 1 });

  it('runs the tiny model: input · W + b', async () => {
    const session = await sut.load(buildTinyModel().bytes, ['cpu']);
    const x = [1, 2, 3, 4, -1, 0.5, 0, 2];
    const [output] = await session.run([fp32('input', x, [2, 4])], []);
    expect(output!.name).toBe('output');
    expect(output!.datatype).toBe(DataType.FP32);
    expect(output!.shape).toEqual([2n, 3n]);
    const expected = [0, 1].flatMap((r) =>
      [0, 1, 2].map((o) => TINY_BIAS[o]! + [0, 1, 2, 3].reduce((sum, i) => sum + x[r * 4 + i]! * TINY_WEIGHT[i * 3 + o]!, 0)),
    );
    floats(output!).forEach((v, i) => expect(v).toBeCloseTo(expected[i]!, 5));
    await session.release();
  });

  it('reads the signature from the model, -1 for the dynamic batch dimension', async () => {
    const session = await sut.load(buildMultiIoModel().bytes, ['cpu']);
    expect(session.inputs.map((s) => [s.name, s.datatype, s.shape])).toEqual([
      ['x', DataType.FP32, [-1n, 4n]],
      ['ids', DataType.INT64, [-1n, 2n]],
    ]);
    expect(session.outputs.map((s) => [s.name, s.datatype])).toEqual([
      ['y', DataType.FP32],
      ['ids_plus_one', DataType.INT64],
      ['positive', DataType.BOOL],
    ]);
    await session.release();
  });

  it('runs the multi-io model, every output in its own datatype', async () => {
    const session = await sut.load(buildMultiIoModel().bytes, ['cpu']);
    const outputs = await session.run([fp32('x', [1, -2, 0, 3.5, -0.5, 4, 5, -6], [2, 4]), int64('ids', [0n, 41n, -1n, 2n ** 62n], [2, 2])], []);
    expect(outputs.map((o) => o.name)).toEqual(['y', 'ids_plus_one', 'positive']);
    expect(floats(outputs[0]!)).toEqual([2, -4, 0, 7, -1, 8, 10, -12]);
    expect(bigints(outputs[1]!)).toEqual([1n, 42n, 0n, 2n ** 62n + 1n]);
    expect(outputs[2]!.datatype).toBe(DataType.BOOL);
    expect(Array.from(outputs[2]!.data)).toEqual([1, 0, 0, 1, 0, 1, 1, 0]);
    expect(outputs[2]!.shape).toEqual([2n, 4n]);
    await session.release();
  });

  it('returns only the outputs asked for, in the order asked', async () => {
    const session = await sut.load(buildMultiIoModel().bytes, ['cpu']);
    const outputs = await session.run([fp32('x', [1, -1, 1, -1], [1, 4]), int64('ids', [7n, 8n], [1, 2])], ['positive', 'ids_plus_one']);
    expect(outputs.map((o) => o.name)).toEqual(['positive', 'ids_plus_one']);
    expect(Array.from(outputs[0]!.data)).toEqual([1, 0, 1, 0]);
    await session.release();
  });

  it('answers INVALID_ARGUMENT for an unknown output and for input the model refuses', async () => {
    const session = await sut.load(buildTinyModel().bytes, ['cpu']);
    const unknown = await rpcRejection(session.run([fp32('input', [1, 2, 3, 4], [1, 4])], ['logits']));
    expect(unknown.code).toBe(status.INVALID_ARGUMENT);
    expect(unknown.message).toMatch(/"logits"/);
    const refused = await rpcRejection(session.run([fp32('input', [1, 2, 3], [1, 3])], []));
    expect(refused.code).toBe(status.INVALID_ARGUMENT);
    expect(refused.reason).toBe('INVALID_TENSOR');
    await session.release();
  });

  it('falls back to the next execution provider and records the one that created the session', async () => {
    const session = await sut.load(buildTinyModel().bytes, ['no-such-provider', 'cpu']);
    expect(session.executionProvider).toBe('cpu');
    await session.release();
  });

  it('fails with every provider\'s reason when none can load the model', async () => {
    await expect(sut.load(Buffer.from('not an onnx model'), ['no-such-provider', 'cpu'])).rejects.toThrow(ModelLoadError);
    await expect(sut.load(Buffer.from('not an onnx model'), ['cpu'])).rejects.toThrow(/cpu: /);
  });
});
