import { create } from '@bufbuild/protobuf';
import { InferenceRequestSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { BatchingPolicy } from '../batching-policy';
import type { PendingRequest } from '../pending-request';

/** A version's policy: batches of up to 8 items, no delay, one priority level, unless given. */
export function policy(overrides: Partial<BatchingPolicy> = {}): BatchingPolicy {
  return {
    maxBatchSize: 8,
    maxQueueDelayMs: 0,
    preferredBatchSizes: [],
    preserveOrdering: false,
    priorityLevels: 1,
    defaultPriorityLevel: 1,
    maxQueueSize: 100,
    ...overrides,
  };
}

let nextId = 0;

/**
 * A request as a version queue holds it, with `items` items (`bytes` of inputs) of batch key `key`
 * (or `alone`, one that cannot join others) at priority `level`, arrived at `arrivedAtMs`.
 */
export function pending(
  name: string,
  options: { items?: number; bytes?: number; key?: string; alone?: boolean; level?: number; arrivedAtMs?: number } = {},
): PendingRequest {
  const { items = 1, bytes = 0, key = 'k', alone = false, level = 1, arrivedAtMs = 0 } = options;
  return {
    id: nextId++,
    request: create(InferenceRequestSchema, { id: name }),
    requestId: name,
    items,
    bytes,
    key: alone ? undefined : key,
    level,
    arrivedAtMs,
    deadlineMs: undefined,
    span: undefined,
    resolve: () => undefined,
    reject: () => undefined,
    queued: false,
    settled: false,
    batch: undefined,
    cancelDeadline: undefined,
    unlink: undefined,
  };
}

/** The request ids of some pending requests. */
export const names = (entries: Iterable<PendingRequest>) => [...entries].map((e) => e.request.id);
