import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  ProcessingSchema,
  type Signature,
  SignatureSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { thrownBy } from '@infermesh/testing';
import { checkProcessing, sameProcessing } from './processing-check';

/** An image classifier: image FP32 [-1, 8, 8, 3], mask INT64 [-1, 8], scores FP32 [-1, 3], ... */
function signature(maxBatchSize = 64): Signature {
  return create(SignatureSchema, {
    inputs: [
      { name: 'image', datatype: DataType.FP32, shape: [-1n, 8n, 8n, 3n] },
      { name: 'half', datatype: DataType.FP16, shape: [-1n, 2n] },
      { name: 'wide', datatype: DataType.FP64, shape: [-1n, -1n] },
      { name: 'mask', datatype: DataType.INT64, shape: [-1n, 8n] },
      { name: 'flat', datatype: DataType.FP32, shape: [-1n] },
    ],
    outputs: [
      { name: 'scores', datatype: DataType.FP32, shape: [-1n, 3n] },
      { name: 'grid', datatype: DataType.FP32, shape: [-1n, 2n, 3n] },
      { name: 'logits', datatype: DataType.INT32, shape: [-1n, -1n] },
      { name: 'positive', datatype: DataType.BOOL, shape: [-1n, 3n] },
    ],
    maxBatchSize,
  });
}

type Init = MessageInitShape<typeof ProcessingSchema>;
const check = (init: Init, sig = signature()) => checkProcessing(create(ProcessingSchema, init), sig);

const refusal = (init: Init, sig = signature()): RpcError => thrownBy(() => check(init, sig), RpcError);

describe(checkProcessing.name, () => {
  it('accepts scalar and per-channel normalizations and labels matching the classes, and returns them', () => {
    const init: Init = {
      inputNormalizations: [
        { input: 'image', mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] },
        { input: 'half', mean: [0.5] },
        { input: 'wide', std: [2, 4, 8] },
      ],
      outputLabels: [
        { output: 'scores', labels: ['cat', 'dog', 'bird'] },
        { output: 'grid', labels: ['a', 'b', 'c', 'd', 'e', 'f'] },
        { output: 'logits', labels: ['x', 'y'] },
      ],
    };
    expect(check(init)).toEqual(create(ProcessingSchema, init));
  });

  it('returns undefined for no processing or an empty one', () => {
    expect(checkProcessing(undefined, signature())).toBeUndefined();
    expect(check({})).toBeUndefined();
  });

  it('counts every element of an output as a class when the model does not batch', () => {
    const sig = create(SignatureSchema, {
      inputs: [],
      outputs: [{ name: 'scores', datatype: DataType.FP32, shape: [2n, 3n] }],
      maxBatchSize: 0,
    });
    expect(check({ outputLabels: [{ output: 'scores', labels: ['1', '2', '3', '4', '5', '6'] }] }, sig)).toBeDefined();
    expect(refusal({ outputLabels: [{ output: 'scores', labels: ['1', '2', '3'] }] }, sig).message).toContain(
      'has 6 classes per item but 3 labels',
    );
  });

  it.each<[string, Init, string]>([
    [
      'an unknown input',
      { inputNormalizations: [{ input: 'photo', mean: [1] }] },
      'no input "photo" to normalize; its inputs are "image", ',
    ],
    [
      'an unknown output',
      { outputLabels: [{ output: 'probs', labels: ['a'] }] },
      'no output "probs" to label; its outputs are "scores", ',
    ],
    [
      'an input normalized twice',
      {
        inputNormalizations: [
          { input: 'half', mean: [1] },
          { input: 'half', std: [2] },
        ],
      },
      'input "half" is normalized more than once',
    ],
    [
      'an output labelled twice',
      {
        outputLabels: [
          { output: 'scores', labels: ['a', 'b', 'c'] },
          { output: 'scores', labels: ['a', 'b', 'c'] },
        ],
      },
      'output "scores" is labelled more than once',
    ],
    [
      'a non-float input',
      { inputNormalizations: [{ input: 'mask', mean: [1] }] },
      'input "mask" is INT64; only FP16, FP32 and FP64 inputs can be normalized',
    ],
    [
      'a normalization without mean or std',
      { inputNormalizations: [{ input: 'image' }] },
      'the normalization of input "image" gives neither mean nor std',
    ],
    ['a std of 0', { inputNormalizations: [{ input: 'half', mean: [1], std: [0] }] }, 'input "half": std is 0'],
    [
      'a per-channel std with a 0',
      { inputNormalizations: [{ input: 'image', std: [1, 0, 1] }] },
      'input "image": std[1] is 0',
    ],
    [
      'a mean that is not finite',
      { inputNormalizations: [{ input: 'image', mean: [Number.NaN] }] },
      'input "image": mean[0] is NaN, not a finite number',
    ],
    [
      'a std that is infinite',
      { inputNormalizations: [{ input: 'image', std: [1, Infinity, 1] }] },
      'input "image": std[1] is Infinity',
    ],
    [
      'a vector not matching the last dimension',
      { inputNormalizations: [{ input: 'image', mean: [1, 2, 3, 4] }] },
      'input "image": mean has 4 values but the last dimension of [-1,8,8,3] is 3; give 1 or 3',
    ],
    [
      'a vector along the batch dimension',
      { inputNormalizations: [{ input: 'flat', std: [1, 2] }] },
      'input "flat" [-1] has no dimension to give std per position along',
    ],
    [
      'mean and std vectors of different lengths',
      { inputNormalizations: [{ input: 'wide', mean: [1, 2], std: [1, 2, 3] }] },
      'input "wide": mean has 2 values but std has 3',
    ],
    [
      'labels of a BOOL output',
      { outputLabels: [{ output: 'positive', labels: ['a', 'b', 'c'] }] },
      'output "positive" is BOOL, not numeric scores',
    ],
    [
      'an empty list of labels',
      { outputLabels: [{ output: 'logits', labels: [] }] },
      'output "logits" is given an empty list of labels',
    ],
    [
      'too few labels',
      { outputLabels: [{ output: 'scores', labels: ['cat', 'dog'] }] },
      'output "scores" [-1,3] has 3 classes per item but 2 labels are given',
    ],
    [
      'too many labels',
      { outputLabels: [{ output: 'grid', labels: ['a', 'b', 'c', 'd', 'e', 'f', 'g'] }] },
      'output "grid" [-1,2,3] has 6 classes per item but 7 labels',
    ],
  ])('refuses %s with INVALID_ARGUMENT naming the problem', (_label, init, message) => {
    const error = refusal(init);
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(/^processing: /);
    expect(error.message).toContain(message);
  });
});

describe(sameProcessing.name, () => {
  it('treats unset and empty as the same, and any difference as different', () => {
    const labels = create(ProcessingSchema, { outputLabels: [{ output: 'scores', labels: ['a', 'b', 'c'] }] });
    expect(sameProcessing(undefined, create(ProcessingSchema))).toBe(true);
    expect(
      sameProcessing(
        labels,
        create(ProcessingSchema, { outputLabels: [{ output: 'scores', labels: ['a', 'b', 'c'] }] }),
      ),
    ).toBe(true);
    expect(sameProcessing(labels, undefined)).toBe(false);
    expect(
      sameProcessing(
        labels,
        create(ProcessingSchema, { outputLabels: [{ output: 'scores', labels: ['a', 'c', 'b'] }] }),
      ),
    ).toBe(false);
  });
});
