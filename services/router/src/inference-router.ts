import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError, toRpcError, Errors } from '@infermesh/grpc';
import {
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type CachePolicy,
  type ModelVersion,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, LATENCY_BUCKETS_SECONDS, Metrics, ModelLabels, requestContext } from '@infermesh/telemetry';
import { versionIdOf } from '@infermesh/rollout';
import { cacheKey, checkInputs } from '@infermesh/tensors';
import type { Counter, Histogram } from 'prom-client';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { GuardedBatcher } from './guarded-batcher';
import { LocalResultCache } from './local-result-cache';
import { ShadowTraffic } from './shadow-traffic';
import { TrafficReporter } from './traffic-reporter';
import { CacheAdapter } from './upstreams.adapter';
import { VersionResolver } from './version-resolver';

type CacheOutcome = 'local_hit' | 'hit' | 'miss' | 'bypass' | 'coalesced' | 'disabled';

/**
 * The router's use case: resolve the version that serves a request, check the request against that
 * version's signature, answer from the result cache when it can, and otherwise run the request
 * through the batcher and remember the result. The cache is optional on the path: when it fails or
 * is slow the request goes on without it.
 */
@Injectable()
export class InferenceRouter {
  private readonly requests: Counter<'model' | 'version' | 'outcome'>;
  private readonly cacheOutcomes: Counter<'outcome'>;
  private readonly routes: Counter<'model' | 'version' | 'route'>;
  private readonly fallbacks: Counter<'model' | 'fallback' | 'reason'>;
  private readonly hitSeconds: Histogram;
  private readonly lookupsSkipped: Counter;
  private readonly local: LocalResultCache;
  /** Inferences running for cache misses, by cache key: identical misses join them. */
  private readonly inflight = new Map<string, Promise<InferenceResponse>>();
  private readonly duration: Histogram<'model' | 'version' | 'cached'>;

  constructor(
    private readonly resolver: VersionResolver,
    private readonly cache: CacheAdapter,
    private readonly batcher: GuardedBatcher,
    private readonly shadow: ShadowTraffic,
    private readonly traffic: TrafficReporter,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
    private readonly logger: JsonLogger,
    private readonly labels: ModelLabels,
    private readonly metrics: Metrics,
    private readonly clock: Clock,
  ) {
    this.requests = metrics.counter(
      'requests_total',
      'Inference requests by model, served version and outcome (status code).',
      ['model', 'version', 'outcome'],
    );
    this.cacheOutcomes = metrics.counter(
      'cache_requests_total',
      "Result cache use by outcome: local_hit (the router's own cache), hit (the shared cache), miss, bypass (cache failed or slow), coalesced (joined an identical miss in flight), disabled.",
      ['outcome'],
    );
    this.lookupsSkipped = metrics.counter(
      'cache_lookups_skipped_total',
      "Misses the router did not ask the shared cache about: the cache's filter of the keys it holds lacks the key (counted as misses too).",
      [],
    );
    metrics.gauge(
      'cache_keys_known',
      "1 while the router holds the shared cache's filter of the keys it holds and skips lookups of keys it lacks; 0 while it looks every key up (the cache not reached yet, restarting, or backed by Redis).",
      [],
      (gauge) => gauge.set(this.cache.knowsKeys ? 1 : 0),
    );
    this.routes = metrics.counter(
      'routed_total',
      'Requests by model, the version that serves them, and how it was chosen: explicit, stable, canary or variant.',
      ['model', 'version', 'route'],
    );
    this.local = new LocalResultCache(config.cache.local.maxBytes, config.cache.local.ttlMs, clock);
    metrics.gauge('local_cache_bytes', "Bytes held by the router's own result cache.", [], (gauge) =>
      gauge.set(this.local.size),
    );
    this.hitSeconds = metrics.histogram(
      'cache_hit_seconds',
      'Time to answer a request from the result cache (its lookup).',
    );
    this.fallbacks = metrics.counter(
      'fallbacks_total',
      'Requests answered by the fallback model, marked degraded, by model, fallback and why.',
      ['model', 'fallback', 'reason'],
    );
    this.duration = metrics.histogram(
      'request_duration_seconds',
      'Time to route and answer an inference request, successful ones only, by model, the version that answered and whether from a cache.',
      ['model', 'version', 'cached'],
      LATENCY_BUCKETS_SECONDS,
      { exemplars: true },
    );
  }

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const start = this.clock.monotonic();
    const model = request.modelName;
    try {
      return await this.routeAndServe(request, start);
    } catch (error) {
      const rpcError = toRpcError(error);
      const fallback =
        request.modelVersion === '' && fallsBack(rpcError) ? await this.resolver.fallbackOf(model).catch(() => '') : '';
      if (fallback !== '') {
        try {
          requestContext.current()?.span?.addEvent('fallback', {
            'infermesh.model': model,
            'infermesh.fallback': fallback,
            'infermesh.fallback.reason': rpcError.reason ?? String(rpcError.code),
          });
          const response = await this.routeAndServe(
            create(InferenceRequestSchema, { ...request, modelName: fallback }),
            start,
          );
          requestContext.current()?.span?.setAttribute('infermesh.route', 'fallback');
          this.fallbacks.inc({
            model: this.labels.model(model),
            fallback: this.labels.model(fallback),
            reason: rpcError.reason ?? String(rpcError.code),
          });
          return { ...response, degraded: true };
        } catch {
          // The fallback cannot answer either: the client learns why the model it asked for could not.
        }
      }
      throw rpcError;
    }
  }

  /** Resolves the version that serves the request, checks the request against it, and answers it. */
  private async routeAndServe(request: InferenceRequest, start: number): Promise<InferenceResponse> {
    const model = request.modelName;
    let version = '';
    /** The version's resource name, once resolved: its traffic is reported to the registry under it. */
    let versionName = '';
    try {
      if (model === '') throw Errors.invalidRequest('the request names no model');
      const resolved = await this.resolver.resolve(model, request.modelVersion, request.routingKey);
      versionName = resolved.version.name;
      version = versionIdOf(versionName);
      this.routes.inc({ ...this.labels.of(model, version), route: resolved.route });
      requestContext.current()?.span?.setAttributes({
        'infermesh.model': model,
        'infermesh.model.version': version,
        'infermesh.route': resolved.route,
      });
      this.check(model, resolved.version, request);
      const routed = create(InferenceRequestSchema, { ...request, modelVersion: version });
      const response = await this.serve(routed, resolved.version.artifact?.sha256 ?? '', resolved.cache);
      const seconds = (this.clock.monotonic() - start) / 1000;
      this.requests.inc({ ...this.labels.of(model, version), outcome: 'OK' });
      this.metrics.observe(
        this.duration,
        { ...this.labels.of(model, version), cached: String(response.cached) },
        seconds,
      );
      this.traffic.succeeded(versionName, seconds);
      if (resolved.shadow !== undefined) this.shadow.mirror(routed, resolved.shadow, response, seconds * 1000);
      return response;
    } catch (error) {
      const rpcError = toRpcError(error);
      const labels = model === '' ? { model: '(none)', version } : this.labels.of(model, version);
      this.requests.inc({ ...labels, outcome: String(rpcError.code) });
      if (versionName !== '') this.traffic.failed(versionName, rpcError.code);
      throw rpcError;
    }
  }

  private check(model: string, version: ModelVersion, request: InferenceRequest): void {
    if (version.state !== VersionState.READY) {
      throw Errors.modelNotReady(`model "${model}" version ${versionIdOf(version.name)} is not ready`);
    }
    const signature = version.signature;
    if (signature === undefined) throw Errors.modelNotReady(`model "${model}" has no signature yet`);
    const problem = checkInputs(model, signature.inputs, request.inputs, signature.maxBatchSize);
    if (problem !== undefined) throw Errors.invalidTensor(problem);
    const outputs = new Set(signature.outputs.map((o) => o.name));
    for (const name of request.outputNames) {
      if (!outputs.has(name)) {
        throw Errors.invalidTensor(
          `model "${model}" has no output "${name}"; its outputs are ${[...outputs].map((o) => `"${o}"`).join(', ')}`,
        );
      }
    }
  }

  /**
   * Answers from the result cache when it can, else runs the request and remembers the answer, as the
   * model's cache policy says. Entries are keyed by the version's artifact too: a model deleted and
   * created again under the same version id with other weights is never answered from the old ones.
   */
  private async serve(
    request: InferenceRequest,
    artifactSha256: string,
    policy: CachePolicy | undefined,
  ): Promise<InferenceResponse> {
    const span = requestContext.current()?.span;
    if (!this.config.cache.enabled || policy?.enabled === false) {
      span?.setAttribute('infermesh.cache', 'disabled');
      this.cacheOutcomes.inc({ outcome: 'disabled' });
      return this.batcher.infer(request);
    }
    const key = cacheKey(request, artifactSha256, this.config.cache.perTenant ? request.tenant : '');
    const ttlMs = policy !== undefined && policy.ttlMs > 0n ? Number(policy.ttlMs) : this.config.cache.ttlMs;
    const flight = key.toString('hex');
    const local = this.local.get(flight);
    if (local !== undefined) {
      span?.setAttribute('infermesh.cache', 'local_hit');
      this.cacheOutcomes.inc({ outcome: 'local_hit' });
      return { ...local, id: request.id, cached: true };
    }
    let outcome: CacheOutcome = 'miss';
    if (this.cache.certainlyAbsent(key)) this.lookupsSkipped.inc();
    else
      try {
        const lookupStart = process.hrtime.bigint();
        const cached = await this.cache.lookup(key, this.config.cache.timeoutMs);
        if (cached !== undefined) {
          span?.setAttribute('infermesh.cache', 'hit');
          this.cacheOutcomes.inc({ outcome: 'hit' });
          this.hitSeconds.observe(Number(process.hrtime.bigint() - lookupStart) / 1e9);
          this.local.set(flight, cached, ttlMs || undefined);
          return { ...cached, id: request.id, cached: true };
        }
      } catch (error) {
        outcome = 'bypass';
        this.logger.debug('result cache unavailable; serving without it', { err: toRpcError(error).message });
      }
    // Identical requests that miss together share one inference.
    const running = this.inflight.get(flight);
    if (running !== undefined) {
      span?.setAttribute('infermesh.cache', 'coalesced');
      this.cacheOutcomes.inc({ outcome: 'coalesced' });
      return { ...(await running), id: request.id };
    }
    span?.setAttribute('infermesh.cache', outcome);
    this.cacheOutcomes.inc({ outcome });
    // Shared by whoever joins it, so it does not end when the request that started it is cancelled;
    // it keeps that request's deadline, and is traced as part of that request.
    const ambient = requestContext.current();
    const shared = requestContext
      .run(
        {
          requestId: ambient?.requestId ?? request.id,
          ...(ambient?.deadlineMs !== undefined && { deadlineMs: ambient.deadlineMs }),
          ...(span !== undefined && { span }),
        },
        () => this.batcher.infer(request),
      )
      .finally(() => this.inflight.delete(flight));
    this.inflight.set(flight, shared);
    const response = await shared;
    const bytes = response.outputs.reduce((n, t) => n + t.data.byteLength, 0);
    if (policy !== undefined && policy.maxEntryBytes > 0n && bytes > Number(policy.maxEntryBytes)) return response;
    // The router's own cache holds what the shared cache answered it (a request asked at least twice)
    // and, while the shared cache cannot be asked, what it computed. An answer the shared cache will
    // hold is not copied here as well: where inputs are seldom repeated, each copy was one the garbage
    // collector moved and traced until it was evicted (distinct inputs, c=16: 5 to 7 % of the
    // services' CPU per request).
    if (outcome === 'bypass') this.local.set(flight, response, ttlMs || undefined);
    if (outcome === 'miss') {
      // Written after the answer, off the request's path: not a span of its trace.
      const untraced = { requestId: ambient?.requestId ?? request.id };
      requestContext
        .run(untraced, () => this.cache.store(key, response, ttlMs, this.config.cache.timeoutMs * 10))
        .catch((error: unknown) => {
          this.logger.debug('result cache store failed', { err: toRpcError(error).message });
        });
    }
    return response;
  }
}

/**
 * Failures the fallback model covers: the model has no ready replica or cannot be reached (any
 * UNAVAILABLE, an open circuit included), or its queue is full. A request the model refused as
 * invalid, or one whose deadline passed, is not retried elsewhere.
 */
function fallsBack(error: RpcError): boolean {
  return (
    error.code === status.UNAVAILABLE || (error.code === status.RESOURCE_EXHAUSTED && error.reason === 'QUEUE_FULL')
  );
}
