import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { RpcError, toRpcError, Errors } from '@infermesh/grpc';
import { Metrics, requestContext } from '@infermesh/telemetry';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ConcurrencyLimit } from './concurrency-limit';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';
import { GatewayMetrics } from '../gateway-metrics';
import { RouterClient } from '../upstreams/router.client';

/** How long a client refused at the concurrency limit is told to wait. */
const RETRY_AFTER_MS = 1_000;

/** A place among the inference requests in flight, taken before the request's body is read; `release` gives it back, once. */
export class Admission {
  private released = false;
  /** How long the router took to answer; unset while it has not, or when it failed. */
  answeredInMs: number | undefined;

  constructor(
    private readonly limit: ConcurrencyLimit,
    private readonly admitted: number,
  ) {}

  release(): void {
    if (this.released) return;
    this.released = true;
    this.limit.release(this.admitted, this.answeredInMs);
  }
}

/**
 * Runs inference through the router and counts its outcomes. Each request first takes a place under
 * the gateway's concurrency limit (`admit`), before its body is read or decoded: past the limit the
 * system is behind, and a request is refused at once (RESOURCE_EXHAUSTED, OVERLOADED, retry in a
 * second) instead of waiting in this process's memory behind the others. The limit adapts to the
 * latency the router answers in (GATEWAY_CONCURRENCY_LIMIT, ConcurrencyLimit), or is fixed at
 * GATEWAY_MAX_IN_FLIGHT.
 */
@Injectable()
export class ModelInference {
  private readonly limit: ConcurrencyLimit;
  private refusalError: { limit: number; error: RpcError } | undefined;

  constructor(
    private readonly router: RouterClient,
    private readonly metrics: GatewayMetrics,
    @Inject(GATEWAY_CONFIG) private readonly config: GatewayConfig,
    registry: Metrics,
    private readonly clock: Clock,
  ) {
    this.limit = new ConcurrencyLimit({ ...config.concurrency, clock });
    registry.gauge('inference_in_flight', 'Inference requests the gateway works on now.', [], (gauge) =>
      gauge.set(this.limit.inFlight),
    );
    registry.gauge(
      'concurrency_limit',
      'Inference requests the gateway lets in flight at once: adaptive (GATEWAY_CONCURRENCY_LIMIT) between GATEWAY_MIN_IN_FLIGHT and GATEWAY_MAX_IN_FLIGHT, or fixed at the latter.',
      [],
      (gauge) => gauge.set(this.limit.limit),
    );
  }

  /** Takes a place under the concurrency limit, or refuses the request (OVERLOADED) when none is free. */
  admit(): Admission {
    const admitted = this.limit.tryAcquire();
    if (admitted === undefined) throw this.refused();
    return new Admission(this.limit, admitted);
  }

  /**
   * The refusal of a request arriving now when no place is free (counted as one), else undefined; no
   * place is taken. For shedding calls before they are read (GrpcServer.shedWith): one that passes
   * still takes its place with `admit`, which may refuse it then.
   */
  refusal(): RpcError | undefined {
    return this.limit.refuses() ? this.refused() : undefined;
  }

  private refused(): RpcError {
    this.metrics.countInference('(not routed)', '', 'overloaded');
    const limit = this.limit.limit;
    // One error per limit value: under overload thousands of refusals a second share it.
    if (this.refusalError?.limit !== limit) {
      const setting = this.config.concurrency.adaptive
        ? 'adaptive: GATEWAY_CONCURRENCY_LIMIT, between GATEWAY_MIN_IN_FLIGHT and GATEWAY_MAX_IN_FLIGHT'
        : 'fixed: GATEWAY_MAX_IN_FLIGHT';
      const error = Errors.overloaded(
        `the gateway is at its limit of ${limit} inference requests in flight (${setting}); retry later`,
        { retryDelayMs: RETRY_AFTER_MS },
      );
      this.refusalError = { limit, error };
    }
    return this.refusalError.error;
  }

  /**
   * Runs one admitted inference. The router's answer time is the limit's latency sample, taken when
   * the admission is released; a failed request gives no sample.
   */
  async infer(admission: Admission, request: InferenceRequest, signal?: AbortSignal): Promise<InferenceResponse> {
    // The request's span says what was asked and by which tenant (never the key), then what answered.
    const span = requestContext.current()?.span;
    span?.setAttributes({
      'infermesh.model': request.modelName,
      'infermesh.tenant': request.tenant,
      'infermesh.request_id': requestContext.current()!.requestId,
    });
    const started = this.clock.monotonic();
    try {
      const response = await this.router.infer(request, signal);
      admission.answeredInMs = this.clock.monotonic() - started;
      const outcome = response.degraded ? 'degraded' : response.cached ? 'cached' : 'ok';
      span?.setAttributes({
        'infermesh.model.version': response.modelVersion,
        'infermesh.cached': response.cached,
        'infermesh.degraded': response.degraded,
      });
      this.metrics.countInference(response.modelName, response.modelVersion, outcome);
      return response;
    } catch (error) {
      const code = toRpcError(error).code;
      // An unknown model name is the client's free text: it must not become a label value.
      const model = code === status.NOT_FOUND ? '(unknown)' : request.modelName;
      this.metrics.countInference(model, request.modelVersion, (status[code] ?? String(code)).toLowerCase());
      throw error;
    }
  }
}
