import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { Clock } from '@infermesh/clock';
import { Errors } from '@infermesh/grpc';
import type { RateLimit } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import {
  type Bucket,
  type Decision,
  FallbackRateLimiter,
  MemoryRateLimiter,
  RateLimiter,
  RateLimitStoreUnavailableError,
  RedisRateLimiter,
} from '@infermesh/rate-limit';
import { createRedisClient, waitForRedis } from '@infermesh/redis';
import type { JsonLogger } from '@infermesh/telemetry';
import { checkModelId } from '@infermesh/rollout';
import type { Principal } from './api-keys/api-keys';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { GatewayMetrics } from '../gateway-metrics';

/** The bucket of every request of a key, and the prefix of the bucket of each of its models. */
const KEY_BUCKET = 'all';
const MODEL_BUCKET = 'model:';

/** A rate as people read it: 5, 0.5, 0.001. */
const rate = (perS: number) => String(Number(perS.toPrecision(6)));

/** The buckets a request of `limit` to `model` draws from: none when the limit limits nothing. */
export function bucketsOf(limit: RateLimit | undefined, model: string): Bucket[] {
  const buckets: Bucket[] = [];
  if (limit === undefined) return buckets;
  if (limit.requestsPerSecond > 0) {
    buckets.push({
      key: KEY_BUCKET,
      ratePerS: limit.requestsPerSecond,
      burst: limit.burst > 0 ? limit.burst : Math.max(1, limit.requestsPerSecond),
    });
  }
  if (limit.perModelRequestsPerSecond > 0) {
    buckets.push({
      key: `${MODEL_BUCKET}${model}`,
      ratePerS: limit.perModelRequestsPerSecond,
      burst: limit.perModelBurst > 0 ? limit.perModelBurst : Math.max(1, limit.perModelRequestsPerSecond),
    });
  }
  return buckets;
}

/**
 * The rate limits of inference: token buckets per key (`all`) and per key and model (`model:<name>`),
 * kept per key id, with the key's limits or, for configured keys and stored keys without limits of
 * their own, GATEWAY_RATE_LIMIT_*. A request over a limit is refused (RESOURCE_EXHAUSTED, RATE_LIMITED,
 * with the time until it would pass) and counted; a principal without limits costs nothing.
 */
@Injectable()
export class RateLimits implements OnApplicationShutdown {
  constructor(
    private readonly limiter: RateLimiter,
    private readonly metrics: GatewayMetrics,
    @Inject(GATEWAY_CONFIG) private readonly config: Pick<GatewayConfig, 'rateLimitRedisDown'>,
  ) {}

  /** Takes a token from each bucket of the principal's request to `model`, or refuses it. */
  async admit(principal: Principal, model: string): Promise<void> {
    const limit = principal.rateLimit;
    if (limit === undefined || (limit.requestsPerSecond <= 0 && limit.perModelRequestsPerSecond <= 0)) return;
    // A model's name becomes part of a bucket's key: only a name a model can have (it would be NOT_FOUND anyway).
    if (limit.perModelRequestsPerSecond > 0) checkModelId(model);
    const buckets = bucketsOf(limit, model);
    let decision: Decision;
    try {
      decision = await this.limiter.take(principal.keyId, buckets);
    } catch (error) {
      if (!(error instanceof RateLimitStoreUnavailableError)) throw error;
      throw Errors.upstreamUnavailable(
        `the rate-limit store (Redis) cannot be reached, and GATEWAY_RATE_LIMIT_REDIS_DOWN=${this.config.rateLimitRedisDown} refuses inference until it can; retry later`,
        { retryDelayMs: 1_000 },
      );
    }
    if (decision.allowed) return;
    const bucket = buckets.find((b) => b.key === decision.limitedBy) ?? buckets[0]!;
    const perModel = bucket.key !== KEY_BUCKET;
    this.metrics.countRateLimited(perModel ? 'model' : 'key');
    throw Errors.rateLimited(refusal(principal, bucket, perModel ? model : undefined, decision.retryAfterMs), {
      retryDelayMs: decision.retryAfterMs,
      metadata: { bucket: perModel ? 'model' : 'key' },
    });
  }

  async onApplicationShutdown(): Promise<void> {
    await this.limiter.close();
  }
}

/** Names the limit that refused, never a configured key: "rate limit of key apiKeys/…: 5 requests/s per key (burst 10); retry in 2 s". */
function refusal(principal: Principal, bucket: Bucket, model: string | undefined, retryAfterMs: number): string {
  const configured = principal.keyId.startsWith('config:');
  const whose = configured ? 'this API key' : `key apiKeys/${principal.keyId}`;
  const retry = `retry in ${Math.max(1, Math.ceil(retryAfterMs / 1000))} s`;
  const source = configured
    ? model === undefined
      ? ', GATEWAY_RATE_LIMIT_RPS'
      : ', GATEWAY_RATE_LIMIT_PER_MODEL_RPS'
    : '';
  const limit = `${rate(bucket.ratePerS)} requests/s per ${model === undefined ? 'key' : 'model'} (burst ${rate(bucket.burst)}${source})`;
  return model === undefined
    ? `rate limit of ${whose}: ${limit}; ${retry}`
    : `rate limit of ${whose} for model "${model}": ${limit}; ${retry}`;
}

/**
 * The gateway's rate limiter: with REDIS_URL, buckets in Redis shared by every replica and, while
 * Redis cannot be reached, the GATEWAY_RATE_LIMIT_REDIS_DOWN policy (each decision counted, a warning
 * logged once per outage); without it, buckets in this process.
 */
export async function createRateLimiter(
  config: Pick<GatewayConfig, 'redisUrl' | 'redisKeyPrefix' | 'rateLimitRedisDown'>,
  logger: JsonLogger,
  metrics: GatewayMetrics,
  clock: Clock,
): Promise<RateLimiter> {
  if (config.redisUrl === undefined) return new MemoryRateLimiter(undefined, clock);
  const client = createRedisClient(config.redisUrl, logger, 'gateway-rate-limit');
  await waitForRedis(client, 5_000).catch((error: unknown) =>
    logger.warn(
      `redis not ready at start-up; rate limits follow GATEWAY_RATE_LIMIT_REDIS_DOWN=${config.rateLimitRedisDown} until it is`,
      {
        err: String(error),
      },
    ),
  );
  const outage = new StoreOutage(logger, config.rateLimitRedisDown);
  return new FallbackRateLimiter(
    new WatchedRateLimiter(new RedisRateLimiter(client, `${config.redisKeyPrefix}rate-limit:`), outage),
    new MemoryRateLimiter(undefined, clock),
    config.rateLimitRedisDown,
    metrics.rateLimitFallbacks,
    (error) => outage.failed(error),
  );
}

/** Logs the start and the end of an outage of the shared store, once each. */
class StoreOutage {
  private down = false;

  constructor(
    private readonly logger: JsonLogger,
    private readonly policy: string,
  ) {}

  failed(error: unknown): void {
    if (this.down) return;
    this.down = true;
    this.logger.warn(
      `rate-limit store (Redis) unreachable: GATEWAY_RATE_LIMIT_REDIS_DOWN=${this.policy} applies until it is back`,
      {
        err: error instanceof Error ? error.message : String(error),
      },
    );
  }

  answered(): void {
    if (!this.down) return;
    this.down = false;
    this.logger.info('rate-limit store (Redis) reachable again: the shared limits apply');
  }
}

/** The shared limiter, telling the outage log when it answers. */
class WatchedRateLimiter extends RateLimiter {
  constructor(
    private readonly inner: RateLimiter,
    private readonly outage: StoreOutage,
  ) {
    super();
  }

  async take(scope: string, buckets: readonly Bucket[]): Promise<Decision> {
    const decision = await this.inner.take(scope, buckets);
    this.outage.answered();
    return decision;
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
