import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { thrownBy } from '@infermesh/testing';
import { DataType, type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type ModelVersion,
  ModelVersionSchema,
  type ProcessingSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { decodeBytesElements, fromHalfBits, toHalfBits } from '@infermesh/tensors';
import { ModelProcessing, printfFixed } from './model-processing';

const refusal = (call: () => unknown): RpcError => thrownBy(call, RpcError);

const bytes = (view: ArrayBufferView) => new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
const f32 = (values: number[]) => bytes(Float32Array.from(values));
const tensor = (name: string, datatype: DataType, shape: number[], data: Uint8Array): Tensor =>
  create(TensorSchema, { name, datatype, shape: shape.map(BigInt), data });
const strings = (t: Tensor) => decodeBytesElements(t.data)!.map((e) => e.toString('utf8'));

/**
 * A classifier version: "image" FP32 [-1, 2, 3] (3 channels last), "half" FP16 [-1, 2], "wide"
 * FP64 [-1, -1], "ids" INT64 [-1, 2]; outputs "scores" FP32 [-1, 4], "logits" [-1, -1] INT64,
 * "flags" BOOL [-1, 4], "half_scores" FP16 [-1, 3].
 */
function version(processing?: MessageInitShape<typeof ProcessingSchema>, maxBatchSize = 8): ModelVersion {
  return create(ModelVersionSchema, {
    name: 'models/classifier/versions/1',
    signature: {
      inputs: [
        { name: 'image', datatype: DataType.FP32, shape: [-1n, 2n, 3n] },
        { name: 'half', datatype: DataType.FP16, shape: [-1n, 2n] },
        { name: 'wide', datatype: DataType.FP64, shape: [-1n, -1n] },
        { name: 'ids', datatype: DataType.INT64, shape: [-1n, 2n] },
      ],
      outputs: [
        { name: 'scores', datatype: DataType.FP32, shape: [-1n, 4n] },
        { name: 'logits', datatype: DataType.INT64, shape: [-1n, -1n] },
        { name: 'flags', datatype: DataType.BOOL, shape: [-1n, 4n] },
        { name: 'half_scores', datatype: DataType.FP16, shape: [-1n, 3n] },
      ],
      maxBatchSize,
    },
    ...(processing !== undefined && { processing }),
  });
}

const LABELLED = version({ outputLabels: [{ output: 'scores', labels: ['cat', 'dog', 'bird', 'fish'] }] });

describe(ModelProcessing.name, () => {
  describe('preprocess', () => {
    const sut = new ModelProcessing(
      version({
        inputNormalizations: [
          { input: 'image', mean: [1, 2, 3], std: [2, 4, 0.5] },
          { input: 'half', mean: [0.5], std: [0.25] },
          { input: 'wide', std: [10] },
        ],
      }),
    );

    it('normalizes an FP32 input per position along its last dimension, exactly as by hand', () => {
      const image = tensor('image', DataType.FP32, [1, 2, 3], f32([3, 2, 4, 1, 10, 3.5]));
      const [out] = sut.preprocess([image]);
      // (3-1)/2, (2-2)/4, (4-3)/0.5, (1-1)/2, (10-2)/4, (3.5-3)/0.5
      expect(Array.from(new Float32Array(out!.data.slice().buffer))).toEqual([1, 0, 2, 0, 2, 1]);
      expect(out).toMatchObject({ name: 'image', datatype: DataType.FP32, shape: [1n, 2n, 3n] });
    });

    it('computes in double precision and rounds once to FP32', () => {
      const only = new ModelProcessing(version({ inputNormalizations: [{ input: 'image', mean: [0.1], std: [3] }] }));
      const x = [1, 2, 3, 4, 5, 6];
      const [out] = only.preprocess([tensor('image', DataType.FP32, [1, 2, 3], f32(x))]);
      expect(Array.from(new Float32Array(out!.data.slice().buffer))).toEqual(
        x.map((v) => Math.fround((Math.fround(v) - 0.1) / 3)),
      );
    });

    it('normalizes FP16 through half-precision bits and FP64 with std alone', () => {
      const half = tensor('half', DataType.FP16, [1, 2], bytes(Uint16Array.from([toHalfBits(1), toHalfBits(0.25)])));
      const wide = tensor('wide', DataType.FP64, [1, 3], bytes(Float64Array.from([0.1, -20, 5])));
      const [h, w] = sut.preprocess([half, wide]);
      expect(Array.from(new Uint16Array(h!.data.slice().buffer), fromHalfBits)).toEqual([2, -1]);
      expect(Array.from(new Float64Array(w!.data.slice().buffer))).toEqual([0.1 / 10, -2, 0.5]);
    });

    it('reads data at any byte offset and leaves the given tensors and the other inputs alone', () => {
      const backing = new Uint8Array(1 + 24);
      backing.set(f32([3, 2, 4, 1, 10, 3.5]), 1);
      const image = tensor('image', DataType.FP32, [1, 2, 3], backing.subarray(1));
      const ids = tensor('ids', DataType.INT64, [1, 2], bytes(BigInt64Array.from([1n, 2n])));
      const [out, sameIds] = sut.preprocess([image, ids]);
      expect(Array.from(new Float32Array(out!.data.slice().buffer))).toEqual([1, 0, 2, 0, 2, 1]);
      expect(Array.from(new Float32Array(image.data.slice().buffer))).toEqual([3, 2, 4, 1, 10, 3.5]);
      expect(sameIds).toBe(ids);
    });

    it('checks a per-position normalization against a dynamic last dimension, naming the input', () => {
      const perColumn = new ModelProcessing(version({ inputNormalizations: [{ input: 'wide', mean: [1, 2] }] }));
      expect(
        Array.from(
          new Float64Array(
            perColumn
              .preprocess([tensor('wide', DataType.FP64, [2, 2], bytes(Float64Array.from([1, 2, 3, 4])))])[0]!
              .data.slice().buffer,
          ),
        ),
      ).toEqual([0, 0, 2, 2]);
      const error = refusal(() =>
        perColumn.preprocess([tensor('wide', DataType.FP64, [1, 3], bytes(Float64Array.from([1, 2, 3])))]),
      );
      expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
      expect(error.message).toBe(
        'input "wide" has shape [1,3], but its normalization has 2 values for its last dimension',
      );
    });

    it('hands inputs back unchanged when the version normalizes nothing', () => {
      const none = new ModelProcessing(version());
      const image = tensor('image', DataType.FP32, [1, 2, 3], f32([1, 2, 3, 4, 5, 6]));
      expect(none.normalizesInputs).toBe(false);
      expect(sut.normalizesInputs).toBe(true);
      expect(none.preprocess([image])[0]).toBe(image);
    });
  });

  describe('postprocess', () => {
    const scores = tensor('scores', DataType.FP32, [2, 4], f32([0.1, 0.7, 0.15, 0.05, 2, -1, 2, 3.25]));

    it('returns the top classes of each batch item as "score:index:label", highest first', () => {
      const [out] = new ModelProcessing(LABELLED).postprocess([scores], { scores: 2 });
      expect(out).toMatchObject({ name: 'scores', datatype: DataType.BYTES, shape: [2n, 2n] });
      expect(strings(out!)).toEqual(['0.700000:1:dog', '0.150000:2:bird', '3.250000:3:fish', '2.000000:0:cat']);
    });

    it('breaks ties by the lower index and can return every class', () => {
      const [out] = new ModelProcessing(LABELLED).postprocess([scores], { scores: 4 });
      expect(strings(out!).slice(4)).toEqual([
        '3.250000:3:fish',
        '2.000000:0:cat',
        '2.000000:2:bird',
        '-1.000000:1:dog',
      ]);
    });

    it('writes "score:index" for classes without a label', () => {
      const [out] = new ModelProcessing(version()).postprocess([scores], { scores: 1 });
      expect(strings(out!)).toEqual(['0.700000:1', '3.250000:3']);
    });

    it('passes the other outputs through in their order', () => {
      const flags = tensor('flags', DataType.BOOL, [2, 4], Uint8Array.of(1, 0, 0, 1, 0, 0, 0, 0));
      const outputs = new ModelProcessing(LABELLED).postprocess([flags, scores], { scores: 1 });
      expect(outputs[0]).toBe(flags);
      expect(outputs.map((o) => o.name)).toEqual(['flags', 'scores']);
      const untouched = new ModelProcessing(LABELLED).postprocess([flags, scores], {});
      expect(untouched[1]).toBe(scores);
    });

    it('ranks 64-bit integers exactly and prints them as integers', () => {
      const big = 2n ** 60n;
      const logits = tensor('logits', DataType.INT64, [1, 3], bytes(BigInt64Array.from([big, big + 1n, -5n])));
      const [out] = new ModelProcessing(version()).postprocess([logits], { logits: 3 });
      expect(strings(out!)).toEqual([`${big + 1n}:1`, `${big}:0`, '-5:2']);
    });

    it('ranks FP16 scores by their value and puts NaN last', () => {
      const half = tensor(
        'half_scores',
        DataType.FP16,
        [1, 3],
        bytes(Uint16Array.from([0x7e00, toHalfBits(-2), toHalfBits(0.5)])),
      );
      const [out] = new ModelProcessing(version()).postprocess([half], { half_scores: 3 });
      expect(strings(out!)).toEqual(['0.500000:2', '-2.000000:1', 'nan:0']);
    });

    it('treats the whole output as the classes of one item when the model does not batch', () => {
      const fixed = create(ModelVersionSchema, {
        name: 'models/fixed/versions/1',
        signature: { outputs: [{ name: 'scores', datatype: DataType.FP32, shape: [2n, 2n] }], maxBatchSize: 0 },
        processing: { outputLabels: [{ output: 'scores', labels: ['a', 'b', 'c', 'd'] }] },
      });
      const [out] = new ModelProcessing(fixed).postprocess(
        [tensor('scores', DataType.FP32, [2, 2], f32([1, 4, 3, 2]))],
        { scores: 3 },
      );
      expect(out!.shape).toEqual([3n]);
      expect(strings(out!)).toEqual(['4.000000:1:b', '3.000000:2:c', '2.000000:3:d']);
    });

    it('answers an empty batch with an empty result', () => {
      const [out] = new ModelProcessing(LABELLED).postprocess(
        [tensor('scores', DataType.FP32, [0, 4], new Uint8Array(0))],
        { scores: 2 },
      );
      expect(out).toMatchObject({ datatype: DataType.BYTES, shape: [0n, 2n] });
      expect(out!.data.byteLength).toBe(0);
    });

    it.each<[string, Record<string, number>, Tensor[], string]>([
      [
        'more classes than the output has',
        { scores: 5 },
        [scores],
        'output "scores" has 4 classes per item, fewer than the 5 class_count asks for',
      ],
      [
        'more classes than a dynamic output turns out to have',
        { logits: 4 },
        [tensor('logits', DataType.INT64, [1, 3], bytes(BigInt64Array.from([1n, 2n, 3n])))],
        'output "logits" has 3 classes per item, fewer than the 4 class_count asks for',
      ],
      [
        'a BOOL output',
        { flags: 1 },
        [tensor('flags', DataType.BOOL, [1, 4], new Uint8Array(4))],
        'output "flags" is BOOL, not numeric scores; class_count needs a numeric output',
      ],
      [
        'an unknown output',
        { probs: 1 },
        [scores],
        'class_count is asked of output "probs", but the model has no such output; its outputs are "scores", "logits", "flags", "half_scores"',
      ],
      [
        'an output the request does not return',
        { half_scores: 1 },
        [scores],
        'class_count is asked of output "half_scores", which the request does not return',
      ],
      ['a class count of 0', { scores: 0 }, [scores], 'output "scores": class_count must be a positive integer, got 0'],
    ])(
      'refuses %s with INVALID_ARGUMENT / INVALID_TENSOR naming the output',
      (_label, classCounts, outputs, message) => {
        const error = refusal(() => new ModelProcessing(LABELLED).postprocess(outputs, classCounts));
        expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
        expect(error.message).toContain(message);
      },
    );

    it('refuses before the model runs what the signature already rules out', () => {
      const sut = new ModelProcessing(LABELLED);
      expect(() => sut.checkClassCounts({ scores: 4, logits: 1000 })).not.toThrow();
      expect(refusal(() => sut.checkClassCounts({ scores: 5 })).metadata).toMatchObject({
        output: 'scores',
        class_count: '5',
      });
      expect(refusal(() => sut.checkClassCounts({ flags: 1 })).message).toContain('"flags" is BOOL');
    });
  });
});

describe(printfFixed.name, () => {
  it.each<[number, string]>([
    [Math.fround(0.7), '0.700000'],
    [2.5, '2.500000'],
    [0, '0.000000'],
    [-0, '-0.000000'],
    [-1e-9, '-0.000000'],
    [1 / 128, '0.007812'], // a tie: to even, as printf does (toFixed would give 0.007813)
    [3 / 128, '0.023438'],
    [-5 / 128, '-0.039062'],
    [123456 + 101 / 128, '123456.789062'],
    [1e21, '1000000000000000000000.000000'],
    [-3.4028234663852886e38, '-340282346638528859811704183484516925440.000000'],
    [Infinity, 'inf'],
    [-Infinity, '-inf'],
    [Number.NaN, 'nan'],
  ])('prints %p as %p', (value, expected) => {
    expect(printfFixed(value)).toBe(expected);
  });
});
