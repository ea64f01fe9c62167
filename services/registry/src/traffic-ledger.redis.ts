import { create } from '@bufbuild/protobuf';
import { type TrafficCounters, TrafficCountersSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { Redis } from '@infermesh/redis';
import { ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import { type TrafficDelta, TrafficLedger } from './traffic-ledger';

/** A version's counts live this long after its last report. */
const TTL_SECONDS = 7 * 24 * 3_600;
/** The hash's field of each latency count: `le` and its bound, so that counts kept under other bounds are never read as these. */
const LATENCY_FIELDS = [...ROLLOUT_LATENCY_BOUNDS_SECONDS.map((bound) => `le${bound}`), 'le+Inf'];

/**
 * The ledger in Redis, shared by the registry's replicas (a router's report reaches any of them) and
 * kept across their restarts. One hash per version, `traffic:{model}/{version}`: fields `requests`,
 * `errors`, `failures`, `shadow_items`, `shadow_agreed` and `le{bound}` per latency count (LATENCY_FIELDS), each added with HINCRBY in
 * one MULTI per report; the key expires a week after its last report.
 */
export class RedisTrafficLedger extends TrafficLedger {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    super();
  }

  async add(deltas: readonly TrafficDelta[]): Promise<void> {
    if (deltas.length === 0) return;
    const multi = this.redis.multi();
    for (const { modelId, versionId, counters } of deltas) {
      const key = this.key(modelId, versionId);
      const fields: [string, bigint][] = [
        ['requests', counters.requests],
        ['errors', counters.errors],
        ['failures', counters.failures],
        ['shadow_items', counters.shadowItems],
        ['shadow_agreed', counters.shadowAgreed],
        ...counters.latencyCounts.map((c, i): [string, bigint] => [LATENCY_FIELDS[i]!, c]),
      ];
      for (const [field, count] of fields) if (count > 0n) multi.hincrby(key, field, count.toString());
      multi.expire(key, TTL_SECONDS);
    }
    await multi.exec();
  }

  async read(modelId: string, versionId: string): Promise<TrafficCounters> {
    const hash = await this.redis.hgetall(this.key(modelId, versionId));
    const count = (field: string) => BigInt(hash[field] ?? '0');
    return create(TrafficCountersSchema, {
      requests: count('requests'),
      errors: count('errors'),
      failures: count('failures'),
      shadowItems: count('shadow_items'),
      shadowAgreed: count('shadow_agreed'),
      latencyCounts: LATENCY_FIELDS.map(count),
    });
  }

  close(): Promise<void> {
    this.redis.disconnect();
    return Promise.resolve();
  }

  private key(modelId: string, versionId: string): string {
    return `${this.prefix}traffic:${modelId}/${versionId}`;
  }
}
