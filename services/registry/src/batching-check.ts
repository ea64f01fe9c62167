import { create, equals } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import { type Batching, BatchingSchema, type Signature } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** The longest max_queue_delay_us a version may declare: 10 s. */
const MAX_QUEUE_DELAY_US = 10_000_000n;
/** The most priority levels a version may declare. */
const MAX_PRIORITY_LEVELS = 16;

const invalid = (message: string) => Errors.invalidRequest(`batching: ${message}`);

/**
 * Checks a version's batching against its signature and returns what to store: undefined when it
 * declares nothing (every field at its default). Refuses with INVALID_ARGUMENT, naming the problem: a
 * max_batch_size that is negative or above the signature's (a model whose signature's max_batch_size is
 * 0 does not batch, so only 0 is allowed), a max_queue_delay_us that is negative or above 10 s, a
 * preferred batch size below 1, above the max batch size or given twice, preferred batch sizes when
 * batching is off, more than 16 priority levels, and a default_priority_level above the levels.
 */
export function checkBatching(batching: Batching | undefined, signature: Signature): Batching | undefined {
  if (batching === undefined || isEmptyBatching(batching)) return undefined;
  const maxBatchSize = checkMaxBatchSize(batching.maxBatchSize, signature.maxBatchSize);
  const delayUs = batching.maxQueueDelayUs;
  if (delayUs !== undefined && delayUs < 0n) throw invalid(`max_queue_delay_us is ${delayUs}; it cannot be negative`);
  if (delayUs !== undefined && delayUs > MAX_QUEUE_DELAY_US) {
    throw invalid(`max_queue_delay_us is ${delayUs}, above the limit of ${MAX_QUEUE_DELAY_US} (10 s)`);
  }
  const maxSource = batching.maxBatchSize === undefined ? "the signature's max_batch_size" : 'max_batch_size';
  checkPreferredBatchSizes(batching.preferredBatchSizes, maxBatchSize, maxSource);
  const { priorityLevels, defaultPriorityLevel } = batching;
  if (priorityLevels > MAX_PRIORITY_LEVELS)
    throw invalid(`priority_levels is ${priorityLevels}, above the limit of ${MAX_PRIORITY_LEVELS}`);
  const levels = Math.max(priorityLevels, 1);
  if (defaultPriorityLevel > levels) {
    const declared = priorityLevels === 0 ? 'priority_levels 0 is one level' : `priority_levels ${priorityLevels}`;
    throw invalid(
      `default_priority_level is ${defaultPriorityLevel}, above the ${levels} priority level${levels === 1 ? '' : 's'} (${declared}); give 0 to ${levels}`,
    );
  }
  return canonical(batching);
}

/** True when two batchings declare the same thing; unset and all defaults are the same, and so are preferred sizes in any order. */
export function sameBatching(a: Batching | undefined, b: Batching | undefined): boolean {
  return equals(BatchingSchema, canonical(a ?? create(BatchingSchema)), canonical(b ?? create(BatchingSchema)));
}

/** The batching with its preferred batch sizes in ascending order, as it is stored. */
function canonical(batching: Batching): Batching {
  return create(BatchingSchema, {
    ...batching,
    preferredBatchSizes: [...batching.preferredBatchSizes].sort((x, y) => x - y),
  });
}

function isEmptyBatching(batching: Batching): boolean {
  return (
    batching.maxBatchSize === undefined &&
    batching.maxQueueDelayUs === undefined &&
    batching.preferredBatchSizes.length === 0 &&
    !batching.preserveOrdering &&
    batching.priorityLevels === 0 &&
    batching.defaultPriorityLevel === 0 &&
    batching.maxQueueSize === 0
  );
}

/** The version's effective max batch size: the declared one when set, else the signature's. */
function checkMaxBatchSize(declared: number | undefined, signatureMax: number): number {
  if (declared === undefined) return signatureMax;
  if (declared < 0) throw invalid(`max_batch_size is ${declared}; it cannot be negative (0 turns batching off)`);
  if (signatureMax === 0 && declared > 0) {
    throw invalid(
      `max_batch_size is ${declared} but the model does not batch (its signature's max_batch_size is 0); give 0 or leave it unset`,
    );
  }
  if (declared > signatureMax)
    throw invalid(`max_batch_size is ${declared}, above the signature's max_batch_size ${signatureMax}`);
  return declared;
}

/** Each preferred size between 1 and the max batch size, once; maxSource names where that max comes from. */
function checkPreferredBatchSizes(sizes: readonly number[], maxBatchSize: number, maxSource: string): void {
  if (sizes.length === 0) return;
  if (maxBatchSize === 0) {
    throw invalid(`preferred_batch_sizes are given but batching is off (${maxSource} is 0); leave them empty`);
  }
  const seen = new Set<number>();
  for (const size of sizes) {
    if (size < 1) throw invalid(`preferred batch size ${size} is below 1`);
    if (size > maxBatchSize)
      throw invalid(`preferred batch size ${size} is above the max batch size ${maxBatchSize} (${maxSource})`);
    if (seen.has(size)) throw invalid(`preferred batch size ${size} is given more than once`);
    seen.add(size);
  }
}
