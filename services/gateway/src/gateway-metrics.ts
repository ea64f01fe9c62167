import { Injectable } from '@nestjs/common';
import { Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';

export type Protocol = 'rest' | 'grpc';

/**
 * The gateway's own metrics. Labels stay bounded: endpoints are route templates or RPC names, never
 * raw paths; models are named only once the registry or router knew them.
 */
@Injectable()
export class GatewayMetrics {
  private readonly requestSeconds: Histogram<'protocol' | 'endpoint' | 'code'>;
  private readonly inferences: Counter<'model' | 'version' | 'outcome'>;
  private readonly rateLimited: Counter<'bucket'>;
  /** Rate-limit decisions taken by the GATEWAY_RATE_LIMIT_REDIS_DOWN policy while Redis could not be reached. */
  readonly rateLimitFallbacks: Counter<'policy'>;

  constructor(metrics: Metrics) {
    this.requestSeconds = metrics.histogram(
      'request_duration_seconds',
      'Duration of public API requests, by protocol, endpoint (route template or RPC) and status code.',
      ['protocol', 'endpoint', 'code'],
    );
    this.inferences = metrics.counter(
      'inference_requests_total',
      'Inference requests by model, served version and outcome (ok, cached, degraded or the error code).',
      ['model', 'version', 'outcome'],
    );
    this.rateLimited = metrics.counter(
      'rate_limited_total',
      'Inference requests refused by a rate limit, by the bucket that refused: key (all models of a key) or model (one model of a key).',
      ['bucket'],
    );
    for (const bucket of ['key', 'model'] as const) this.rateLimited.inc({ bucket }, 0);
    this.rateLimitFallbacks = metrics.counter(
      'rate_limit_fallbacks_total',
      'Rate-limit decisions taken while Redis could not be reached, by the GATEWAY_RATE_LIMIT_REDIS_DOWN policy that applied.',
      ['policy'],
    );
  }

  observeRequest(protocol: Protocol, endpoint: string, code: string, startNs: bigint): void {
    this.requestSeconds.observe({ protocol, endpoint, code }, Number(process.hrtime.bigint() - startNs) / 1e9);
  }

  countInference(model: string, version: string, outcome: string): void {
    this.inferences.inc({ model, version, outcome });
  }

  countRateLimited(bucket: 'key' | 'model'): void {
    this.rateLimited.inc({ bucket });
  }
}
