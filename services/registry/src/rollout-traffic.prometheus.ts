import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { type TrafficCounters, TrafficCountersSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { SERVICE_ERROR_CODES } from '@infermesh/rollout';
import { LATENCY_BUCKETS_SECONDS } from '@infermesh/telemetry';
import { RolloutTraffic } from './rollout-traffic';

/** How long one Prometheus query may take. */
const QUERY_TIMEOUT_MS = 5_000;

interface VectorSample {
  metric: Record<string, string>;
  value: [number, string];
}

/**
 * The routers' metrics as Prometheus scraped them: increase() over the time since the step started of
 * infermesh_router_requests_total (all, the service's error codes, and every error but CANCELLED), of the successful requests'
 * infermesh_router_request_duration_seconds buckets, and of the shadow comparisons where the version
 * ran as the shadow. Prometheus sums over the routers and copes with their restarts; the step must
 * last a few scrape intervals for increase() to see it.
 */
export class PrometheusRolloutTraffic extends RolloutTraffic {
  /** The routers' histogram's: a p99 read from them is as coarse as they are (ROLLOUT_LATENCY_BOUNDS_SECONDS says how much). */
  readonly latencyBoundsSeconds = LATENCY_BUCKETS_SECONDS;

  constructor(
    private readonly url: string,
    private readonly prefix = 'infermesh_router_',
  ) {
    super();
  }

  mark(): Promise<undefined> {
    return Promise.resolve(undefined);
  }

  async since(
    modelId: string,
    versionId: string,
    _mark: TrafficCounters | undefined,
    stepStart: Date,
    now: Date,
  ): Promise<TrafficCounters> {
    const range = `${Math.max(1, Math.ceil((now.getTime() - stepStart.getTime()) / 1000))}s`;
    const selector = `model=${quote(modelId)},version=${quote(versionId)}`;
    const errorCodes = [...SERVICE_ERROR_CODES].join('|');
    const shadow = `model=${quote(modelId)},shadow=${quote(versionId)}`;
    const [requests, errors, failures, buckets, items, agreed] = await Promise.all([
      this.scalar(`sum(increase(${this.prefix}requests_total{${selector}}[${range}]))`, now),
      this.scalar(`sum(increase(${this.prefix}requests_total{${selector},outcome=~"${errorCodes}"}[${range}]))`, now),
      this.scalar(
        `sum(increase(${this.prefix}requests_total{${selector},outcome!~"OK|${status.CANCELLED}"}[${range}]))`,
        now,
      ),
      this.vector(`sum by (le) (increase(${this.prefix}request_duration_seconds_bucket{${selector}}[${range}]))`, now),
      this.scalar(`sum(increase(${this.prefix}shadow_compared_items_total{${shadow}}[${range}]))`, now),
      this.scalar(`sum(increase(${this.prefix}shadow_agreed_items_total{${shadow}}[${range}]))`, now),
    ]);
    return create(TrafficCountersSchema, {
      requests: whole(requests),
      errors: whole(errors),
      failures: whole(failures),
      latencyCounts: latencyCounts(buckets),
      shadowItems: whole(items),
      shadowAgreed: whole(agreed),
    });
  }

  private async scalar(query: string, now: Date): Promise<number> {
    const samples = await this.vector(query, now);
    return samples.length === 0 ? 0 : Number(samples[0]!.value[1]);
  }

  private async vector(query: string, now: Date): Promise<VectorSample[]> {
    const body = new URLSearchParams({ query, time: String(now.getTime() / 1000) });
    const response = await fetch(new URL('/api/v1/query', this.url), {
      method: 'POST',
      body,
      signal: AbortSignal.timeout(QUERY_TIMEOUT_MS),
    });
    const json = (await response.json().catch(() => undefined)) as
      { status?: string; error?: string; data?: { resultType?: string; result?: VectorSample[] } } | undefined;
    if (!response.ok || json?.status !== 'success' || json.data?.resultType !== 'vector') {
      throw new Error(
        `Prometheus at ${this.url} answered ${response.status} to ${query}: ${json?.error ?? 'no vector'}`,
      );
    }
    return json.data.result ?? [];
  }
}

/** A PromQL string literal. */
function quote(value: string): string {
  return JSON.stringify(value);
}

/** increase() extrapolates: a count, rounded. */
function whole(value: number): bigint {
  return Number.isFinite(value) && value > 0 ? BigInt(Math.round(value)) : 0n;
}

/** Cumulative `le` buckets to a count per LATENCY_BUCKETS_SECONDS bound and one above the last. */
function latencyCounts(samples: readonly VectorSample[]): bigint[] {
  const cumulative = new Map(samples.map((s) => [Number(s.metric['le']), Number(s.value[1])]));
  const counts: bigint[] = [];
  let below = 0;
  for (const bound of [...LATENCY_BUCKETS_SECONDS, Number.POSITIVE_INFINITY]) {
    const atOrBelow = Math.max(below, cumulative.get(bound) ?? below);
    counts.push(whole(atOrBelow - below));
    below = atOrBelow;
  }
  return counts;
}
