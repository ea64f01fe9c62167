import { create } from '@bufbuild/protobuf';
import { DataType, TensorSchema, TensorSpecSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { encodeBytesElements } from './bytes-elements';
import { checkData, checkInputs } from './signature-check';

const spec = (name: string, datatype: DataType, shape: number[]) =>
  create(TensorSpecSchema, { name, datatype, shape: shape.map(BigInt) });

function tensor(init: { name: string; datatype: DataType; shape: number[]; data: Uint8Array }) {
  return create(TensorSchema, { ...init, shape: init.shape.map(BigInt) });
}

/** An FP32 tensor of the given shape with the right amount of data. */
function fp32(name: string, shape: number[]) {
  const count = shape.reduce((a, b) => a * b, 1);
  return tensor({ name, datatype: DataType.FP32, shape, data: new Uint8Array(count * 4) });
}

const declared = [spec('image', DataType.FP32, [-1, 3, 2]), spec('scale', DataType.FP32, [1])];

describe('checkInputs', () => {
  it('accepts every declared input given once with fitting shapes and data, in any order', () => {
    expect(checkInputs('resnet', declared, [fp32('scale', [1]), fp32('image', [4, 3, 2])], 8)).toBeUndefined();
  });

  it('lets a -1 dimension take any size, zero included', () => {
    expect(checkInputs('resnet', declared, [fp32('image', [1, 3, 2]), fp32('scale', [1])])).toBeUndefined();
    expect(checkInputs('resnet', declared, [fp32('image', [1000, 3, 2]), fp32('scale', [1])])).toBeUndefined();
    expect(checkInputs('resnet', declared, [fp32('image', [0, 3, 2]), fp32('scale', [1])])).toBeUndefined();
  });

  it('names a missing input and the model', () => {
    expect(checkInputs('resnet', declared, [fp32('image', [1, 3, 2])])).toBe(
      'input "scale" of model "resnet" is missing',
    );
  });

  it('names an unknown input and lists the inputs the model has', () => {
    expect(checkInputs('resnet', declared, [fp32('image', [1, 3, 2]), fp32('scale', [1]), fp32('bias', [1])])).toBe(
      'model "resnet" has no input "bias"; its inputs are "image", "scale"',
    );
  });

  it('names an input given twice', () => {
    expect(checkInputs('resnet', declared, [fp32('scale', [1]), fp32('image', [1, 3, 2]), fp32('scale', [1])])).toBe(
      'input "scale" is given more than once',
    );
  });

  it('names an input of the wrong datatype with both datatypes', () => {
    const int32 = tensor({ name: 'scale', datatype: DataType.INT32, shape: [1], data: new Uint8Array(4) });

    expect(checkInputs('resnet', declared, [fp32('image', [1, 3, 2]), int32])).toBe(
      'input "scale" has datatype INT32 but model "resnet" expects FP32',
    );
  });

  it.each([
    ['a wrong fixed dimension', [1, 4, 2]],
    ['too few dimensions', [3, 2]],
    ['too many dimensions', [1, 3, 2, 1]],
  ])('names an input with %s and both shapes', (_label, shape) => {
    expect(checkInputs('resnet', declared, [fp32('image', shape), fp32('scale', [1])])).toBe(
      `input "image" has shape [${shape.join(',')}] but model "resnet" expects [-1,3,2]`,
    );
  });

  it('refuses a negative dimension even where the model declares -1', () => {
    const negative = tensor({ name: 'image', datatype: DataType.FP32, shape: [-1, 3, 2], data: new Uint8Array(0) });

    expect(checkInputs('resnet', declared, [negative, fp32('scale', [1])])).toBe(
      'input "image" has a negative dimension in shape [-1,3,2]',
    );
  });

  it('refuses a batch over the maximum, naming both, and allows the maximum itself', () => {
    expect(checkInputs('resnet', declared, [fp32('image', [9, 3, 2]), fp32('scale', [1])], 8)).toBe(
      'input "image" has batch size 9 but model "resnet" allows at most 8',
    );
    expect(checkInputs('resnet', declared, [fp32('image', [8, 3, 2]), fp32('scale', [1])], 8)).toBeUndefined();
  });

  it('puts no limit on the batch when the maximum is 0', () => {
    expect(checkInputs('resnet', declared, [fp32('image', [100_000, 3, 2]), fp32('scale', [1])], 0)).toBeUndefined();
  });

  it('refuses data whose length does not match the shape', () => {
    const short = tensor({ name: 'image', datatype: DataType.FP32, shape: [2, 3, 2], data: new Uint8Array(40) });

    expect(checkInputs('resnet', declared, [short, fp32('scale', [1])])).toBe(
      'input "image" has 40 bytes of data but shape [2,3,2] of FP32 needs 48',
    );
  });

  it('checks BYTES inputs by element count and length prefixes', () => {
    const model = [spec('text', DataType.BYTES, [-1])];
    const bytes = (shape: number[], data: Uint8Array) =>
      tensor({ name: 'text', datatype: DataType.BYTES, shape, data });
    const two = encodeBytesElements([Buffer.from('hi'), Buffer.from('there')]);

    expect(checkInputs('bert', model, [bytes([2], two)])).toBeUndefined();
    expect(checkInputs('bert', model, [bytes([3], two)])).toBe(
      'input "text" has 2 BYTES elements but shape [3] needs 3',
    );
    expect(checkInputs('bert', model, [bytes([2], two.subarray(0, two.length - 1))])).toBe(
      'input "text": BYTES data has a broken 4-byte length prefix',
    );
    expect(checkInputs('bert', model, [bytes([1], Buffer.from([1, 0]))])).toBe(
      'input "text": BYTES data has a broken 4-byte length prefix',
    );
  });

  it('accepts a model without inputs called without inputs', () => {
    expect(checkInputs('constant', [], [])).toBeUndefined();
  });
});

describe('checkData', () => {
  it('accepts a scalar of one element and an empty tensor of no bytes', () => {
    expect(
      checkData(tensor({ name: 's', datatype: DataType.FP64, shape: [], data: new Uint8Array(8) })),
    ).toBeUndefined();
    expect(
      checkData(tensor({ name: 'e', datatype: DataType.INT64, shape: [0, 4], data: new Uint8Array(0) })),
    ).toBeUndefined();
  });

  it('counts bytes by datatype width', () => {
    expect(
      checkData(tensor({ name: 'h', datatype: DataType.FP16, shape: [3], data: new Uint8Array(6) })),
    ).toBeUndefined();
    expect(checkData(tensor({ name: 'h', datatype: DataType.FP16, shape: [3], data: new Uint8Array(12) }))).toBe(
      'input "h" has 12 bytes of data but shape [3] of FP16 needs 6',
    );
  });
});
