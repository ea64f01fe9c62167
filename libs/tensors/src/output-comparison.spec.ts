import { create } from '@bufbuild/protobuf';
import { DataType, type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { addComparisons, compareOutputs } from './output-comparison';

const fp32 = (name: string, values: number[], shape: number[]): Tensor =>
  create(TensorSchema, {
    name,
    datatype: DataType.FP32,
    shape: shape.map(BigInt),
    data: new Uint8Array(Float32Array.from(values).buffer),
  });
const int64 = (name: string, values: bigint[]): Tensor =>
  create(TensorSchema, {
    name,
    datatype: DataType.INT64,
    shape: [BigInt(values.length)],
    data: new Uint8Array(BigInt64Array.from(values).buffer),
  });

describe(compareOutputs.name, () => {
  it('agrees fully, with no difference, for identical outputs', () => {
    const outputs = [fp32('scores', [0.1, 0.9, 0.5, 0.2], [2, 2]), int64('ids', [1n, 2n])];
    const sut = compareOutputs(outputs, outputs);
    expect(sut).toMatchObject({
      items: 3,
      agreed: 3,
      topRows: 2,
      topAgreed: 2,
      maxAbsDiff: 0,
      relativeL2: 0,
      mismatched: 0,
      diffSquares: 0,
    });
    expect(sut.servedSquares).toBeCloseTo(0.1 ** 2 + 0.9 ** 2 + 0.5 ** 2 + 0.2 ** 2, 5);
  });

  it('compares the rows of a [batch, classes] output by their top class, and measures the differences', () => {
    const served = [fp32('scores', [0, 1, 2, 0, 3, 4], [3, 2])];
    // Row 0 keeps class 1; row 1 flips to class 1; row 2 keeps class 1 with a difference of 0.5.
    const shadow = [fp32('scores', [0, 1, 2, 2.5, 3, 4.5], [3, 2])];
    const result = compareOutputs(served, shadow);
    expect(result).toMatchObject({
      items: 3,
      agreed: 2,
      topRows: 3,
      topAgreed: 2,
      maxAbsDiff: 2.5,
      mismatched: 0,
      diffSquares: 2.5 ** 2 + 0.5 ** 2,
      servedSquares: 1 + 4 + 9 + 16,
    });
    expect(result.relativeL2).toBeCloseTo(Math.sqrt(2.5 ** 2 + 0.5 ** 2) / Math.sqrt(1 + 4 + 9 + 16), 6);
  });

  it('counts outputs of another shape, another datatype or missing as mismatched', () => {
    const served = [fp32('a', [1, 2], [2]), fp32('b', [1, 2], [2]), fp32('c', [1], [1])];
    const shadow = [fp32('a', [1, 2, 3], [3]), int64('b', [1n, 2n])];
    expect(compareOutputs(served, shadow)).toMatchObject({ items: 0, mismatched: 3 });
  });

  it('compares outputs that are not floating point bit for bit, one item each', () => {
    expect(compareOutputs([int64('ids', [1n, 2n])], [int64('ids', [1n, 3n])])).toMatchObject({
      items: 1,
      agreed: 0,
      topRows: 0,
      topAgreed: 0,
    });
  });

  it('adds the comparisons of several runs up as if they were one', () => {
    const served = [fp32('scores', [0, 1, 2, 0], [2, 2])];
    const first = compareOutputs(served, [fp32('scores', [0, 1, 2, 2.5], [2, 2])]);
    const second = compareOutputs([fp32('scores', [3, 4], [1, 2])], [fp32('scores', [3, 4.5], [1, 2])]);
    const together = compareOutputs(
      [fp32('scores', [0, 1, 2, 0, 3, 4], [3, 2])],
      [fp32('scores', [0, 1, 2, 2.5, 3, 4.5], [3, 2])],
    );
    const sut = addComparisons(first, second);
    expect(sut).toMatchObject({ items: 3, agreed: 2, topRows: 3, topAgreed: 2, maxAbsDiff: 2.5, mismatched: 0 });
    expect(sut.relativeL2).toBeCloseTo(together.relativeL2, 12);
  });
});
