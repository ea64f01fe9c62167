import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** The batcher's defaults for what a version's Batching leaves unset. */
export interface BatchingDefaults {
  maxQueueDelayUs: number;
  maxQueueSize: number;
}

/** A version's batching settings with every default applied: what the scheduler works with. */
export interface BatchingPolicy {
  /** Largest batch in items; 0 when requests go to workers one by one. */
  readonly maxBatchSize: number;
  readonly maxQueueDelayMs: number;
  /** Ascending; empty when none are preferred. */
  readonly preferredBatchSizes: readonly number[];
  readonly preserveOrdering: boolean;
  /** At least 1; level 1 is the highest priority. */
  readonly priorityLevels: number;
  readonly defaultPriorityLevel: number;
  readonly maxQueueSize: number;
}

/**
 * The policy of a version: its registry Batching (checked by the registry when it was registered)
 * over the batcher's defaults. A model whose signature does not batch never has requests joined.
 */
export function batchingPolicy(version: ModelVersion, defaults: BatchingDefaults): BatchingPolicy {
  const signatureMax = version.signature?.maxBatchSize ?? 0;
  const b = version.batching;
  const maxBatchSize = Math.min(signatureMax, b?.maxBatchSize ?? signatureMax);
  const priorityLevels = Math.max(1, b?.priorityLevels ?? 1);
  const delayUs = b?.maxQueueDelayUs !== undefined ? Number(b.maxQueueDelayUs) : defaults.maxQueueDelayUs;
  return {
    maxBatchSize,
    maxQueueDelayMs: delayUs / 1000,
    preferredBatchSizes:
      maxBatchSize > 0
        ? [...new Set(b?.preferredBatchSizes ?? [])].filter((s) => s <= maxBatchSize).sort((x, y) => x - y)
        : [],
    preserveOrdering: b?.preserveOrdering ?? false,
    priorityLevels,
    defaultPriorityLevel: b?.defaultPriorityLevel ? Math.min(b.defaultPriorityLevel, priorityLevels) : priorityLevels,
    maxQueueSize: b?.maxQueueSize ? b.maxQueueSize : defaults.maxQueueSize,
  };
}
