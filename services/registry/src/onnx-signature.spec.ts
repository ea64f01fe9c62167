import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  buildMlpModel,
  buildMultiIoModel,
  buildTinyModel,
  encodeModel,
  floatInitializer,
  node,
} from '@infermesh/model-builder';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { thrownBy } from '@infermesh/testing';
import { onnx } from 'onnx-proto';
import { maxBatchSizeFor, readOnnxSignature } from './onnx-signature';

const specs = (list: { name: string; datatype: DataType; shape: bigint[] }[]) =>
  list.map(({ name, datatype, shape }) => ({ name, datatype, shape: shape.map(Number) }));

/** A raw ONNX model with the given graph inputs and outputs, for shapes the builders do not make. */
function rawModel(graph: onnx.IGraphProto): Uint8Array {
  return onnx.ModelProto.encode({
    irVersion: 8,
    opsetImport: [{ domain: '', version: 17 }],
    graph: { name: 'raw', ...graph },
  }).finish();
}

const fp32 = (name: string, dims: onnx.TensorShapeProto.IDimension[]): onnx.IValueInfoProto => ({
  name,
  type: { tensorType: { elemType: 1, shape: { dim: dims } } },
});

function invalidArtifact(bytes: Uint8Array): RpcError {
  const error = thrownBy(() => readOnnxSignature(bytes), RpcError);
  expect(error.code).toBe(status.INVALID_ARGUMENT);
  expect(error.reason).toBe('INVALID_ARTIFACT');
  return error;
}

describe(readOnnxSignature.name, () => {
  it('reads the tiny model: input FP32 [-1, 4], output FP32 [-1, 3], initializers left out; it batches', () => {
    const sut = readOnnxSignature(buildTinyModel().bytes);
    expect(specs(sut.inputs)).toEqual([{ name: 'input', datatype: DataType.FP32, shape: [-1, 4] }]);
    expect(specs(sut.outputs)).toEqual([{ name: 'output', datatype: DataType.FP32, shape: [-1, 3] }]);
    expect(sut.unbatchable).toEqual([]);
    expect(maxBatchSizeFor(sut, 64)).toBe(64);
  });

  it('reads every input and output of the multi-io model with its datatype', () => {
    const sut = readOnnxSignature(buildMultiIoModel().bytes);
    expect(specs(sut.inputs)).toEqual([
      { name: 'x', datatype: DataType.FP32, shape: [-1, 4] },
      { name: 'ids', datatype: DataType.INT64, shape: [-1, 2] },
    ]);
    expect(specs(sut.outputs)).toEqual([
      { name: 'y', datatype: DataType.FP32, shape: [-1, 4] },
      { name: 'ids_plus_one', datatype: DataType.INT64, shape: [-1, 2] },
      { name: 'positive', datatype: DataType.BOOL, shape: [-1, 4] },
    ]);
    expect(maxBatchSizeFor(sut, 32)).toBe(32);
  });

  it('agrees with the signature the builder declares for the MLP', () => {
    const built = buildMlpModel({ sizes: [8, 16, 4] });
    const sut = readOnnxSignature(built.bytes);
    expect(sut.inputs.map((s) => [s.name, s.shape.map(Number)])).toEqual(
      built.inputs.map((s) => [s.name, [...s.shape]]),
    );
    expect(sut.outputs.map((s) => [s.name, s.shape.map(Number)])).toEqual(
      built.outputs.map((s) => [s.name, [...s.shape]]),
    );
  });

  it('does not batch a model with a fixed first dimension: max batch size 0', () => {
    const fixed = encodeModel('fixed', {
      nodes: [node('Add', ['input', 'bias'], ['output'], 'add')],
      initializers: [floatInitializer('bias', [4], Float32Array.of(1, 2, 3, 4))],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [1, 4] }],
    });
    const sut = readOnnxSignature(fixed.bytes);
    expect(sut.inputs[0]!.shape.map(Number)).toEqual([1, 4]);
    expect(sut.unbatchable).toEqual(['input', 'output']);
    expect(maxBatchSizeFor(sut, 64)).toBe(0);
  });

  it('does not batch a model whose output alone has a fixed first dimension', () => {
    const sut = readOnnxSignature(
      rawModel({ input: [fp32('x', [{ dimParam: 'n' }, { dimValue: 4 }])], output: [fp32('sum', [{ dimValue: 1 }])] }),
    );
    expect(sut.unbatchable).toEqual(['sum']);
    expect(maxBatchSizeFor(sut, 64)).toBe(0);
  });

  it('reads a dimension with neither value nor parameter as dynamic', () => {
    const sut = readOnnxSignature(
      rawModel({ input: [fp32('x', [{}, { dimValue: 4 }])], output: [fp32('y', [{ dimParam: 'n' }, {}])] }),
    );
    expect(sut.inputs[0]!.shape.map(Number)).toEqual([-1, 4]);
    expect(sut.outputs[0]!.shape.map(Number)).toEqual([-1, -1]);
  });

  it('leaves out graph inputs that are initializers (weights with defaults)', () => {
    const sut = readOnnxSignature(
      rawModel({
        input: [fp32('x', [{ dimParam: 'n' }, { dimValue: 4 }]), fp32('w', [{ dimValue: 4 }])],
        initializer: [floatInitializer('w', [4], Float32Array.of(1, 1, 1, 1))],
        output: [fp32('y', [{ dimParam: 'n' }, { dimValue: 4 }])],
      }),
    );
    expect(sut.inputs.map((s) => s.name)).toEqual(['x']);
  });

  it('refuses bytes that are not an ONNX model', () => {
    expect(invalidArtifact(Buffer.from('garbage bytes \x00\x01\x02')).message).toMatch(/not a valid ONNX model/);
    expect(invalidArtifact(new Uint8Array(0)).message).toMatch(/not a valid ONNX model/);
    expect(invalidArtifact(Buffer.from('{"not": "onnx"}')).message).toMatch(/not a valid ONNX model/);
  });

  it('refuses a model whose input is not a tensor, naming it', () => {
    const bytes = rawModel({
      input: [{ name: 'items', type: { sequenceType: { elemType: { tensorType: { elemType: 1 } } } } }],
      output: [fp32('y', [{ dimValue: 1 }])],
    });
    expect(invalidArtifact(bytes).message).toBe(
      'input "items" is a sequence; only tensor inputs and outputs are supported',
    );
  });

  it('refuses an element type the serving path cannot carry, naming the tensor', () => {
    const complex = rawModel({
      input: [fp32('x', [{ dimValue: 1 }])],
      output: [{ name: 'z', type: { tensorType: { elemType: 14, shape: { dim: [{ dimValue: 1 }] } } } }],
    });
    expect(invalidArtifact(complex).message).toBe('output "z" has ONNX element type 14, which is not supported');
  });

  it('refuses an input of unknown rank', () => {
    const bytes = rawModel({
      input: [{ name: 'x', type: { tensorType: { elemType: 1 } } }],
      output: [fp32('y', [{ dimValue: 1 }])],
    });
    expect(invalidArtifact(bytes).message).toMatch(/^input "x" has no shape/);
  });

  it('refuses a model without outputs', () => {
    expect(invalidArtifact(rawModel({ input: [fp32('x', [{ dimValue: 1 }])] })).message).toBe(
      'the ONNX model has no outputs',
    );
  });
});

describe(maxBatchSizeFor.name, () => {
  const batchable = readOnnxSignature(buildTinyModel().bytes);
  const fixed = readOnnxSignature(
    rawModel({ input: [fp32('x', [{ dimValue: 2 }])], output: [fp32('y', [{ dimValue: 2 }])] }),
  );

  it('lets the request override the default', () => {
    expect(maxBatchSizeFor(batchable, 64, 8)).toBe(8);
    expect(maxBatchSizeFor(batchable, 64, 0)).toBe(0);
    expect(maxBatchSizeFor(fixed, 64, 0)).toBe(0);
  });

  it('refuses a batch size for a model that cannot batch, naming the tensors', () => {
    expect(() => maxBatchSizeFor(fixed, 64, 8)).toThrow(
      'max_batch_size 8 needs a dynamic first dimension on every input and output, but "x", "y" have none',
    );
  });

  it('refuses a negative batch size', () => {
    expect(() => maxBatchSizeFor(batchable, 64, -1)).toThrow('max_batch_size must be 0 or more, got -1');
  });
});
