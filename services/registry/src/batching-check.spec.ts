import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  BatchingSchema,
  type Signature,
  SignatureSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { thrownBy } from '@infermesh/testing';
import { checkBatching, sameBatching } from './batching-check';

/** A model taking input FP32 [-1, 4] and returning output FP32 [-1, 3], batching up to maxBatchSize. */
function signature(maxBatchSize = 32): Signature {
  return create(SignatureSchema, {
    inputs: [{ name: 'input', datatype: DataType.FP32, shape: [-1n, 4n] }],
    outputs: [{ name: 'output', datatype: DataType.FP32, shape: [-1n, 3n] }],
    maxBatchSize,
  });
}

type Init = MessageInitShape<typeof BatchingSchema>;
const check = (init: Init, sig = signature()) => checkBatching(create(BatchingSchema, init), sig);

const refusal = (init: Init, sig = signature()): RpcError => thrownBy(() => check(init, sig), RpcError);

describe(checkBatching.name, () => {
  it('accepts every field within its limits and returns the batching with its preferred sizes in ascending order', () => {
    const init: Init = {
      maxBatchSize: 16,
      maxQueueDelayUs: 10_000_000n,
      preferredBatchSizes: [8, 16, 4],
      preserveOrdering: true,
      priorityLevels: 16,
      defaultPriorityLevel: 16,
      maxQueueSize: 1000,
    };
    expect(check(init)).toEqual(create(BatchingSchema, { ...init, preferredBatchSizes: [4, 8, 16] }));
  });

  it('returns undefined for no batching or one with every field at its default', () => {
    expect(checkBatching(undefined, signature())).toBeUndefined();
    expect(check({})).toBeUndefined();
  });

  it('keeps a max_batch_size of 0, which turns batching off, and a delay of 0, unlike unset ones', () => {
    expect(check({ maxBatchSize: 0 })?.maxBatchSize).toBe(0);
    expect(check({ maxQueueDelayUs: 0n })?.maxQueueDelayUs).toBe(0n);
  });

  it('checks preferred batch sizes against the signature when max_batch_size is unset', () => {
    expect(check({ preferredBatchSizes: [1, 32] })?.preferredBatchSizes).toEqual([1, 32]);
    expect(refusal({ preferredBatchSizes: [33] }).message).toBe(
      "batching: preferred batch size 33 is above the max batch size 32 (the signature's max_batch_size)",
    );
  });

  it('lets a model that does not batch declare only max_batch_size 0 and no preferred batch sizes', () => {
    const sig = signature(0);
    expect(check({ maxBatchSize: 0, priorityLevels: 2, maxQueueDelayUs: 500n }, sig)).toBeDefined();
    expect(check({ priorityLevels: 2 }, sig)).toBeDefined();
    expect(refusal({ maxBatchSize: 1 }, sig).message).toBe(
      "batching: max_batch_size is 1 but the model does not batch (its signature's max_batch_size is 0); give 0 or leave it unset",
    );
    expect(refusal({ preferredBatchSizes: [1] }, sig).message).toBe(
      "batching: preferred_batch_sizes are given but batching is off (the signature's max_batch_size is 0); leave them empty",
    );
  });

  it.each<[string, Init, string]>([
    [
      'a negative max_batch_size',
      { maxBatchSize: -1 },
      'max_batch_size is -1; it cannot be negative (0 turns batching off)',
    ],
    [
      'a max_batch_size above the signature',
      { maxBatchSize: 33 },
      "max_batch_size is 33, above the signature's max_batch_size 32",
    ],
    ['a negative max_queue_delay_us', { maxQueueDelayUs: -1n }, 'max_queue_delay_us is -1; it cannot be negative'],
    [
      'a max_queue_delay_us above 10 s',
      { maxQueueDelayUs: 10_000_001n },
      'max_queue_delay_us is 10000001, above the limit of 10000000 (10 s)',
    ],
    ['a preferred batch size of 0', { preferredBatchSizes: [4, 0] }, 'preferred batch size 0 is below 1'],
    ['a negative preferred batch size', { preferredBatchSizes: [-2] }, 'preferred batch size -2 is below 1'],
    [
      'a preferred batch size above max_batch_size',
      { maxBatchSize: 8, preferredBatchSizes: [4, 16] },
      'preferred batch size 16 is above the max batch size 8 (max_batch_size)',
    ],
    [
      'a preferred batch size given twice',
      { preferredBatchSizes: [4, 8, 4] },
      'preferred batch size 4 is given more than once',
    ],
    [
      'preferred batch sizes with batching turned off',
      { maxBatchSize: 0, preferredBatchSizes: [1] },
      'preferred_batch_sizes are given but batching is off (max_batch_size is 0); leave them empty',
    ],
    ['more than 16 priority levels', { priorityLevels: 17 }, 'priority_levels is 17, above the limit of 16'],
    [
      'a default level above the levels',
      { priorityLevels: 3, defaultPriorityLevel: 4 },
      'default_priority_level is 4, above the 3 priority levels (priority_levels 3); give 0 to 3',
    ],
    [
      'a default level above the one level of priority_levels 0',
      { defaultPriorityLevel: 2 },
      'default_priority_level is 2, above the 1 priority level (priority_levels 0 is one level); give 0 to 1',
    ],
  ])('refuses %s with INVALID_ARGUMENT naming the problem', (_label, init, message) => {
    const error = refusal(init);
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toBe(`batching: ${message}`);
  });

  it('accepts a default level of 1 with priority_levels 0, and 0 (the lowest) with any levels', () => {
    expect(check({ defaultPriorityLevel: 1 })?.defaultPriorityLevel).toBe(1);
    expect(check({ priorityLevels: 4, defaultPriorityLevel: 0 })?.priorityLevels).toBe(4);
  });
});

describe(sameBatching.name, () => {
  it('treats unset and all defaults as the same, and any difference as different', () => {
    const batching = create(BatchingSchema, { maxBatchSize: 8, preferredBatchSizes: [4, 8] });
    expect(sameBatching(undefined, create(BatchingSchema))).toBe(true);
    expect(sameBatching(batching, create(BatchingSchema, { maxBatchSize: 8, preferredBatchSizes: [4, 8] }))).toBe(true);
    expect(sameBatching(batching, create(BatchingSchema, { maxBatchSize: 8, preferredBatchSizes: [8, 4] }))).toBe(true);
    expect(sameBatching(batching, undefined)).toBe(false);
    expect(sameBatching(batching, create(BatchingSchema, { maxBatchSize: 8, preferredBatchSizes: [8] }))).toBe(false);
    expect(sameBatching(undefined, create(BatchingSchema, { maxBatchSize: 0 }))).toBe(false);
    expect(sameBatching(undefined, create(BatchingSchema, { preserveOrdering: true }))).toBe(false);
  });
});
