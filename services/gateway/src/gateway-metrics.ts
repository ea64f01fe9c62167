import { Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { LATENCY_BUCKETS_SECONDS, Metrics, ModelLabels, requestContext, ServedModels } from '@infermesh/telemetry';
import type { Span } from '@opentelemetry/api';
import type { Counter, Histogram } from 'prom-client';

export type Protocol = 'rest' | 'grpc';

/** A request being timed (GatewayMetrics.startRequest). */
export interface RequestTimer {
  /**
   * Records the request's duration under its endpoint and status code; in a sampled trace, with the
   * request's span as its bucket's exemplar. `span` is the current one by default: a caller that
   * records after the request's context has gone (a response's `close` event) passes the request's span.
   */
  end(endpoint: string, code: string, span?: Span): void;
}

/** Outcomes of an inference the router answered: its answer names a model version it resolved. */
const SERVED_OUTCOMES: ReadonlySet<string> = new Set(['ok', 'cached', 'degraded']);
/** The model label of a request refused before it reached the router. */
const NOT_ROUTED = '(not routed)';

/**
 * The gateway's own metrics. Labels stay bounded: endpoints are route templates or RPC names, never
 * raw paths; a model or version becomes a label value only once the router has served it (the router
 * resolves names against the registry), any other name a client sends is `(unknown)`.
 */
@Injectable()
export class GatewayMetrics {
  private readonly requestSeconds: Histogram<'protocol' | 'endpoint' | 'code'>;
  private readonly inferences: Counter<'model' | 'version' | 'outcome'>;
  private readonly rateLimited: Counter<'bucket'>;
  private readonly undeliveredResponses: Counter<'endpoint'>;
  /** Rate-limit decisions taken by the GATEWAY_RATE_LIMIT_REDIS_DOWN policy while Redis could not be reached. */
  readonly rateLimitFallbacks: Counter<'policy'>;
  private readonly served = new ServedModels();
  private readonly modelLabels = new ModelLabels(this.served);

  constructor(
    private readonly metrics: Metrics,
    private readonly clock: Clock,
  ) {
    this.requestSeconds = metrics.histogram(
      'request_duration_seconds',
      'Duration of public API requests, by protocol, endpoint (route template or RPC) and status code.',
      ['protocol', 'endpoint', 'code'],
      LATENCY_BUCKETS_SECONDS,
      { exemplars: true },
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
    this.undeliveredResponses = metrics.counter(
      'http_undelivered_responses_total',
      'REST responses dropped because the client had not taken them within GATEWAY_HTTP_SEND_TIMEOUT_MS (it does not read them): their connections were closed, by endpoint.',
      ['endpoint'],
    );
    this.rateLimitFallbacks = metrics.counter(
      'rate_limit_fallbacks_total',
      'Rate-limit decisions taken while Redis could not be reached, by the GATEWAY_RATE_LIMIT_REDIS_DOWN policy that applied.',
      ['policy'],
    );
  }

  /** Starts timing a request of `protocol` now, on the monotonic clock. */
  startRequest(protocol: Protocol): RequestTimer {
    const startMs = this.clock.monotonic();
    return {
      end: (endpoint, code, span = requestContext.current()?.span) =>
        this.metrics.observe(
          this.requestSeconds,
          { protocol, endpoint, code },
          (this.clock.monotonic() - startMs) / 1000,
          span,
        ),
    };
  }

  /**
   * Counts an inference by outcome: for one the router answered, the model version its answer names
   * (which then becomes a known label value); for a failed one, the model and version the client
   * asked for, when the router has served them, else `(unknown)`.
   */
  countInference(model: string, version: string, outcome: string): void {
    if (SERVED_OUTCOMES.has(outcome)) this.served.remember(model, version);
    this.inferences.inc({
      ...(model === NOT_ROUTED ? { model, version } : this.modelLabels.of(model, version)),
      outcome,
    });
  }

  countRateLimited(bucket: 'key' | 'model'): void {
    this.rateLimited.inc({ bucket });
  }

  countUndeliveredResponse(endpoint: string): void {
    this.undeliveredResponses.inc({ endpoint });
  }
}
