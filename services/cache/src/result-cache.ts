import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { fromBinary } from '@bufbuild/protobuf';
import { encodeMessage, Errors } from '@infermesh/grpc';
import {
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { Clock } from '@infermesh/clock';
import { CACHE_CONFIG, type CacheConfig } from './cache.config';
import { FILTER_CAPACITY, HeldKeys } from './held-keys';
import { ResultStore } from './result-store';

export type LookupOutcome = 'hit' | 'miss' | 'error';

/**
 * The result cache's use cases: look up and store encoded inference responses. A store failure on
 * lookup is reported as a miss, so the cache never fails an inference.
 */
@Injectable()
export class ResultCache implements OnApplicationShutdown {
  private readonly lookups: Counter<'outcome'>;
  private readonly stores: Counter<'outcome'>;
  private readonly lookupSeconds: Histogram<'outcome'>;
  /** The keys held, for the routers that watch them (WatchKeys); undefined when they live in Redis. */
  readonly keys: HeldKeys | undefined;

  constructor(
    private readonly results: ResultStore,
    @Inject(CACHE_CONFIG) private readonly config: CacheConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
    clock: Clock,
  ) {
    this.lookups = metrics.counter('lookups_total', 'Cache lookups by outcome (hit, miss, error).', ['outcome']);
    this.stores = metrics.counter('stores_total', 'Cache stores by outcome (stored, too_large, error).', ['outcome']);
    this.lookupSeconds = metrics.histogram('lookup_duration_seconds', 'Time to look up a cache entry, by outcome.', [
      'outcome',
    ]);
    if (results.heldBytes !== undefined) {
      metrics.gauge(
        'store_bytes',
        'Bytes charged to the results held in this process (values, keys and per-entry overhead), within CACHE_MAX_BYTES.',
        [],
        (gauge) => gauge.set(results.heldBytes ?? 0),
      );
      metrics.gauge(
        'store_budget_bytes',
        'CACHE_MAX_BYTES: the most the results held in this process may be charged.',
        [],
        (gauge) => gauge.set(config.maxBytes),
      );
    }
    if (results.heldKeys() === undefined) this.keys = undefined;
    else {
      const rebuilds = metrics.counter(
        'key_filter_rebuilds_total',
        'Times the filter of held keys was built again from the keys held, once full, and sent whole to every watcher.',
        [],
      );
      const keys = new HeldKeys(
        () => results.heldKeys()!,
        clock,
        FILTER_CAPACITY,
        () => rebuilds.inc(),
      );
      this.keys = keys;
      metrics.gauge('key_watchers', 'Open WatchKeys streams: routers told which keys this cache holds.', [], (gauge) =>
        gauge.set(keys.watcherCount),
      );
    }
  }

  async lookup(key: Uint8Array): Promise<InferenceResponse | undefined> {
    checkKey(key);
    const start = process.hrtime.bigint();
    let outcome: LookupOutcome = 'miss';
    try {
      const value = await this.results.get(Buffer.from(key));
      if (value === undefined) return undefined;
      outcome = 'hit';
      return fromBinary(InferenceResponseSchema, value);
    } catch (error) {
      outcome = 'error';
      this.logger.warn('cache lookup failed; answering miss', {
        err: error instanceof Error ? error.message : String(error),
      });
      return undefined;
    } finally {
      this.lookups.inc({ outcome });
      this.lookupSeconds.observe({ outcome }, Number(process.hrtime.bigint() - start) / 1e9);
    }
  }

  async store(key: Uint8Array, response: InferenceResponse, ttlMs: number): Promise<boolean> {
    checkKey(key);
    // A buffer of its own, of its exact size: a slice of Node's shared buffer pool would keep a whole
    // pool slab alive while cached.
    const value = encodeMessage(InferenceResponseSchema, response, { ownBuffer: true });
    if (value.length > this.config.maxEntryBytes) {
      this.stores.inc({ outcome: 'too_large' });
      return false;
    }
    try {
      const id = Buffer.from(key);
      await this.results.set(id, value, ttlMs > 0 ? ttlMs : this.config.defaultTtlMs);
      this.keys?.stored(id);
      this.stores.inc({ outcome: 'stored' });
      return true;
    } catch (error) {
      this.stores.inc({ outcome: 'error' });
      throw Errors.upstreamUnavailable(`cache store failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  async onApplicationShutdown(): Promise<void> {
    this.keys?.close();
    await this.results.close();
  }
}

/** Refuses a key that is not a SHA-256 (INVALID_ARGUMENT). */
export function checkKey(key: Uint8Array): void {
  if (key.byteLength !== 32)
    throw Errors.invalidRequest(`cache key must be 32 bytes (a SHA-256), got ${key.byteLength}`);
}
