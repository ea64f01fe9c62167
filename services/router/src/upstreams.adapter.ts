import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { Clock } from '@infermesh/clock';
import { createClient, toRpcError } from '@infermesh/grpc';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { CacheService, type StoreRequest, StoreRequestSchema } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Model,
  type ModelVersion,
  RegistryService,
  type ReportTrafficRequestSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { KeyFilter } from '@infermesh/tensors';
import { JsonLogger } from '@infermesh/telemetry';
import { status } from '@grpc/grpc-js';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';

/** How long the router waits for the registry to resolve a version. */
const RESOLVE_TIMEOUT_MS = 5_000;

/** The registry as the router sees it: where a model name resolves to a version. */
@Injectable()
export class RegistryAdapter implements OnApplicationShutdown {
  private readonly client;

  constructor(@Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.client = createClient(RegistryService, config.upstreams.registry);
  }

  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    const { version } = await this.client.resolveModelVersion(
      { model: `models/${model}`, versionId },
      { timeoutMs: RESOLVE_TIMEOUT_MS },
    );
    if (version === undefined) throw new Error(`registry resolved models/${model} to nothing`);
    return version;
  }

  /** The model with its versions and rollout policy. */
  async getModel(model: string): Promise<Model> {
    const { model: found } = await this.client.getModel({ name: `models/${model}` }, { timeoutMs: RESOLVE_TIMEOUT_MS });
    if (found === undefined) throw new Error(`registry answered models/${model} with nothing`);
    return found;
  }

  /** Reports what each version served since the router's last accepted report; rejects when the registry did not take it. */
  async reportTraffic(request: MessageInitShape<typeof ReportTrafficRequestSchema>, deadlineMs: number): Promise<void> {
    await this.client.reportTraffic(request, { deadlineMs });
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}

/** How long an answer waits for a lookup to carry it to the cache before it is sent by itself. */
export const STORE_DELAY_MS = 50;
/** Answers larger than this are sent by themselves at once: a lookup must stay small, it is on a request's path. */
export const CARRIED_MAX_BYTES = 64 * 1024;
/** Answers waiting to be carried, at most: beyond, they are all sent at once. */
const PENDING_MAX_BYTES = 1024 * 1024;
/** The watch of the cache's keys is opened again after a failure, backing off from the first delay to the last. */
export const KEY_WATCH_BACKOFF = { initialMs: 500, maxMs: 30_000 };
/** And after a cache that cannot say which keys it holds (Redis) refused it, this long after. */
export const KEY_WATCH_UNSUPPORTED_RETRY_MS = 5 * 60_000;

/**
 * The result cache service. The router watches which keys the cache holds (WatchKeys: a Bloom filter,
 * then the keys stored since): a key the filter lacks is a miss without asking (certainlyAbsent). A
 * lookup costs one round trip, a message each way on a stream that carries the router's lookups (not
 * a call of its own). The answer computed after a miss is not stored by a call of its own but carried
 * to the cache by the router's next lookup (LookupRequest.stores), or after STORE_DELAY_MS as a Store
 * call carried on a stream of its own (CacheService.Stores), with every other answer waiting then.
 * Answers over CARRIED_MAX_BYTES go at once by themselves. Storing stays best-effort: answers that a
 * failed lookup carried are lost. Until the filter comes, and while the watch is down, every key is
 * looked up.
 */
@Injectable()
export class CacheAdapter implements OnApplicationShutdown {
  private readonly client;
  private pending: StoreRequest[] = [];
  private pendingBytes = 0;
  private pendingTimeoutMs = 0;
  /** Calls off the Store of what waits; undefined when nothing waits. */
  private cancelFlush: (() => void) | undefined;
  /** The keys the cache holds, as it last said; undefined while it has not said. */
  private keys: KeyFilter | undefined;
  private readonly closing = new AbortController();
  private readonly watching: Promise<void>;
  /** Ends the wait between two watches. */
  private wake: (() => void) | undefined;

  constructor(
    @Inject(ROUTER_CONFIG) config: RouterConfig,
    private readonly logger: JsonLogger,
    private readonly clock: Clock,
  ) {
    // Lookups and stores go carried on a stream each (CacheService.Lookups, CacheService.Stores): a
    // message each way costs a fraction of a call of its own, on both sides.
    this.client = createClient(CacheService, config.upstreams.cache, {
      carried: { lookup: 'lookups', store: 'stores' },
    });
    // A lookup has ROUTER_CACHE_TIMEOUT_MS: the first must not spend it resolving and connecting.
    if (config.cache.enabled) this.client.connect();
    this.watching = config.cache.enabled ? this.watchKeys() : Promise.resolve();
  }

  /** Whether the router holds the cache's filter of its keys (else it looks every key up). */
  get knowsKeys(): boolean {
    return this.keys !== undefined;
  }

  /** True when the cache certainly does not hold `key`: it did not when it last said, and this router has not stored it since. */
  certainlyAbsent(key: Uint8Array): boolean {
    return this.keys !== undefined && !this.keys.has(key);
  }

  async lookup(key: Uint8Array, timeoutMs: number): Promise<InferenceResponse | undefined> {
    const stores = this.takePending();
    const result = await this.client.lookup({ key, stores }, { timeoutMs });
    return result.found ? result.response : undefined;
  }

  /** Stores an answer, soon: resolves once it is on its way (a large one: once stored). */
  async store(key: Uint8Array, response: InferenceResponse, ttlMs: number, timeoutMs: number): Promise<void> {
    this.keys?.add(key);
    const request = create(StoreRequestSchema, { key, response, ttlMs: BigInt(ttlMs) });
    const bytes = response.outputs.reduce((n, t) => n + t.data.byteLength, 0);
    if (bytes > CARRIED_MAX_BYTES) {
      await this.client.store(request, { timeoutMs });
      return;
    }
    this.pending.push(request);
    this.pendingBytes += bytes;
    this.pendingTimeoutMs = Math.max(this.pendingTimeoutMs, timeoutMs);
    if (this.pendingBytes > PENDING_MAX_BYTES) void this.flush();
    else this.cancelFlush ??= this.clock.setTimer(() => void this.flush(), STORE_DELAY_MS);
  }

  private takePending(): StoreRequest[] {
    const stores = this.pending;
    this.pending = [];
    this.pendingBytes = 0;
    this.pendingTimeoutMs = 0;
    this.cancelFlush?.();
    this.cancelFlush = undefined;
    return stores;
  }

  /** Sends the answers no lookup has carried, carried together; resolves when all are answered. */
  private flush(): Promise<void> {
    const timeoutMs = this.pendingTimeoutMs;
    return Promise.all(
      this.takePending().map((request) =>
        this.client
          .store(request, { timeoutMs })
          .catch((error: unknown) =>
            this.logger.debug('result cache store failed', { err: toRpcError(error).message }),
          ),
      ),
    ).then(() => undefined);
  }

  /**
   * Follows the cache's keys (WatchKeys) until shutdown: a stream that fails or ends is opened again,
   * backing off (KEY_WATCH_BACKOFF); meanwhile every key is looked up.
   */
  private async watchKeys(): Promise<void> {
    let attempt = 0;
    while (!this.closing.signal.aborted) {
      let retryMs: number;
      try {
        for await (const digest of this.client.watchKeys({}, { signal: this.closing.signal })) {
          if (digest.filter !== undefined) {
            this.keys = new KeyFilter(digest.filter.bits, digest.filter.hashes);
            attempt = 0;
          } else if (this.keys === undefined) {
            throw new Error('the cache sent keys before its filter');
          }
          if (digest.added.byteLength > 0) this.keys.addFingerprints(digest.added);
        }
        throw new Error('the cache ended the watch of its keys');
      } catch (error) {
        this.keys = undefined;
        if (this.closing.signal.aborted) return;
        const unsupported = toRpcError(error).code === status.UNIMPLEMENTED;
        retryMs = unsupported
          ? KEY_WATCH_UNSUPPORTED_RETRY_MS
          : Math.min(KEY_WATCH_BACKOFF.maxMs, KEY_WATCH_BACKOFF.initialMs * 2 ** Math.min(attempt++, 20));
        this.logger.debug(
          unsupported
            ? 'the result cache cannot say which keys it holds; looking every key up'
            : 'watch of the result cache keys lost; looking every key up until it is back',
          { err: error instanceof Error ? error.message : String(error), retry_ms: retryMs },
        );
      }
      await new Promise<void>((resolve) => {
        const cancel = this.clock.setTimer(done, retryMs);
        function done() {
          cancel();
          resolve();
        }
        this.wake = done;
      });
      this.wake = undefined;
    }
  }

  async onApplicationShutdown(): Promise<void> {
    this.closing.abort();
    this.wake?.();
    await this.watching;
    await this.flush();
    this.client.close();
  }
}

/** The batcher, which runs requests on workers. */
@Injectable()
export class BatcherAdapter implements OnApplicationShutdown {
  private readonly client;

  constructor(@Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.client = createClient(BatcherService, config.upstreams.batcher, {
      ...(config.batcherCarried && { carried: { infer: 'infers' } }),
    });
  }

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const { response } = await this.client.infer({ request });
    if (response === undefined) throw new Error('the batcher answered without a response');
    return response;
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}
