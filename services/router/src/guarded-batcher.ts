import { Inject, Injectable } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { RpcError, toRpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { Metrics, requestContext } from '@infermesh/telemetry';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Counter, Gauge } from 'prom-client';
import { CircuitBreaker, type CircuitState } from './circuit-breaker';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { BatcherAdapter } from './upstreams.adapter';

const STATE_VALUE: Record<CircuitState, number> = { closed: 0, half_open: 1, open: 2 };

/** Failures that say the version's serving path is unhealthy: it could not be reached, broke, or timed out. */
function isFailure(error: RpcError): boolean {
  switch (error.code) {
    case status.UNAVAILABLE:
    case status.INTERNAL:
    case status.UNKNOWN:
      return true;
    case status.DEADLINE_EXCEEDED:
      // Refused up front because the queue could not meet the deadline: the path works.
      return error.reason !== 'DEADLINE_INFEASIBLE';
    default:
      return false;
  }
}

/**
 * The batcher as the router calls it: one circuit breaker per model version (consecutive failures
 * or timeouts open it; after the cool-down one probe at a time tests it), and retries of UNAVAILABLE
 * answers with exponential backoff and full jitter, only while the request's deadline leaves room.
 * Other errors, including a full queue, go back to the client at once.
 */
@Injectable()
export class GuardedBatcher {
  private readonly breakers = new Map<string, { model: string; version: string; breaker: CircuitBreaker }>();
  private readonly retries: Counter<'model'>;
  private readonly transitions: Counter<'model' | 'version' | 'state'>;

  constructor(
    private readonly batcher: BatcherAdapter,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
    metrics: Metrics,
  ) {
    this.retries = metrics.counter('batcher_retries_total', 'Requests sent to the batcher again after an UNAVAILABLE answer.', ['model']);
    this.transitions = metrics.counter('circuit_transitions_total', 'Circuit breaker changes of state, by model version and new state.', [
      'model',
      'version',
      'state',
    ]);
    metrics.gauge('circuit_state', 'Circuit breaker of each model version: 0 closed, 1 half-open, 2 open.', ['model', 'version'], (gauge: Gauge<'model' | 'version'>) => {
      for (const { model, version, breaker } of this.breakers.values()) gauge.set({ model, version }, STATE_VALUE[breaker.state]);
    });
  }

  /** Runs a request whose version is resolved on the batcher. */
  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    const breaker = this.breakerOf(model, version);
    const { attempts, baseMs, maxMs } = this.config.retry;
    for (let retry = 0; ; retry++) {
      if (!breaker.tryAcquire()) {
        throw new RpcError(
          status.UNAVAILABLE,
          `model "${model}" version ${version} is failing: its circuit is open after ${this.config.breaker.failureThreshold} consecutive failures; the next attempt goes through in ${Math.ceil(breaker.retryInMs / 1000)} s`,
          { reason: 'CIRCUIT_OPEN', retryDelayMs: breaker.retryInMs },
        );
      }
      let error: RpcError;
      try {
        const response = await this.batcher.infer(request);
        breaker.succeeded();
        return response;
      } catch (thrown) {
        error = toRpcError(thrown);
      }
      if (isFailure(error)) breaker.failed();
      else if (error.code === status.CANCELLED) breaker.abandoned();
      else breaker.succeeded(); // it answered: the path works, the request did not
      if (error.code !== status.UNAVAILABLE || retry >= attempts) throw error;
      const delayMs = Math.random() * Math.min(maxMs, baseMs * 2 ** retry);
      const { deadlineMs, signal } = requestContext.current() ?? {};
      if (deadlineMs !== undefined && Date.now() + delayMs >= deadlineMs) throw error;
      this.retries.inc({ model });
      await sleep(delayMs, undefined, signal === undefined ? undefined : { signal }).catch(() => {
        throw new RpcError(status.CANCELLED, 'the call was cancelled');
      });
    }
  }

  private breakerOf(model: string, version: string): CircuitBreaker {
    const key = `${model}\u0000${version}`;
    let entry = this.breakers.get(key);
    if (entry === undefined) {
      const breaker = new CircuitBreaker({
        failureThreshold: this.config.breaker.failureThreshold,
        cooldownMs: this.config.breaker.cooldownMs,
        onTransition: (state) => this.transitions.inc({ model, version, state }),
      });
      entry = { model, version, breaker };
      this.breakers.set(key, entry);
    }
    return entry.breaker;
  }
}
