import { Inject, Injectable } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { Clock } from '@infermesh/clock';
import { RpcError, toRpcError, Errors } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { Metrics, ModelLabels, requestContext, UNKNOWN_LABEL } from '@infermesh/telemetry';
import type { Counter, Gauge } from 'prom-client';
import { CircuitBreaker, type CircuitState } from './circuit-breaker';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { BatcherAdapter } from './upstreams.adapter';

const STATE_VALUE: Record<CircuitState, number> = { closed: 0, half_open: 1, open: 2 };

/**
 * A timeout counts against the version only when the request gave it at least this many times the
 * version's observed latency (and at least ROUTER_BREAKER_TIMEOUT_MIN_BUDGET_MS).
 */
export const TIMEOUT_BUDGET_LATENCY_FACTOR = 10;

/** How an answer of the batcher counts for the version's circuit. */
type Verdict = 'failure' | 'not_counted';

/**
 * Whether an error is the version's own failure: its serving path could not be reached, broke, or
 * did not answer within a budget it should have met. Nothing the caller caused counts: a refusal of
 * bad input (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION...), a full queue (RESOURCE_EXHAUSTED),
 * a cancelled call, and a deadline that was the caller's to miss.
 *
 * DEADLINE_EXCEEDED is ambiguous: a caller that gives 1 ms gets it without the version doing anything
 * wrong (the router's own client refuses to send a call whose budget is spent), and so does a caller
 * whose budget is shorter than the queue ahead of it; a hung worker or model gives it too. It counts
 * only when the budget was well above what the version needs: at least ROUTER_BREAKER_TIMEOUT_MIN_BUDGET_MS
 * and TIMEOUT_BUDGET_LATENCY_FACTOR times its observed latency (the moving average of its successful
 * calls). Then the version, not the caller, failed to answer in time. A caller cannot open a circuit
 * with short deadlines, and a version that hangs on generous budgets still opens it (its fallback
 * model then answers); a worker that stops answering altogether is also ejected by the batcher, whose
 * requests then come back UNAVAILABLE. DEADLINE_INFEASIBLE (the batcher refused at once because the
 * queue could not meet the deadline) never counts: the path works.
 */
export function verdictOf(
  error: RpcError,
  budgetMs: number,
  observedMs: number | undefined,
  minBudgetMs: number,
): Verdict {
  switch (error.code) {
    case status.UNAVAILABLE:
    case status.INTERNAL:
    case status.UNKNOWN:
    case status.DATA_LOSS:
      return 'failure';
    case status.DEADLINE_EXCEEDED: {
      if (error.reason === 'DEADLINE_INFEASIBLE') return 'not_counted';
      const needed = Math.max(minBudgetMs, TIMEOUT_BUDGET_LATENCY_FACTOR * (observedMs ?? 0));
      return budgetMs >= needed ? 'failure' : 'not_counted';
    }
    default:
      return 'not_counted';
  }
}

/** Weight of the latest success in a version's observed latency (an exponential moving average). */
const LATENCY_SMOOTHING = 0.2;

interface GuardedVersion {
  model: string;
  version: string;
  breaker: CircuitBreaker;
  /** Moving average of the batcher's successful answers, in ms; undefined before the first. */
  latencyMs: number | undefined;
}

/**
 * The batcher as the router calls it: one circuit breaker per model version (consecutive failures
 * of the version's own open it, see verdictOf; after the cool-down one probe at a time tests it), and retries of UNAVAILABLE
 * answers with exponential backoff and full jitter, only while the request's deadline leaves room.
 * Other errors, including a full queue, go back to the client at once.
 */
@Injectable()
export class GuardedBatcher {
  private readonly versions = new Map<string, GuardedVersion>();
  private readonly retries: Counter<'model'>;
  private readonly transitions: Counter<'model' | 'version' | 'state'>;
  private readonly notCounted: Counter<'model' | 'version' | 'code'>;

  constructor(
    private readonly batcher: BatcherAdapter,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
    private readonly labels: ModelLabels,
    metrics: Metrics,
    private readonly clock: Clock,
  ) {
    this.retries = metrics.counter(
      'batcher_retries_total',
      'Requests sent to the batcher again after an UNAVAILABLE answer.',
      ['model'],
    );
    this.transitions = metrics.counter(
      'circuit_transitions_total',
      'Circuit breaker changes of state, by model version and new state.',
      ['model', 'version', 'state'],
    );
    this.notCounted = metrics.counter(
      'circuit_not_counted_total',
      "Errors of a model version's calls that its circuit breaker did not count as the version's failures (caller-side deadlines, cancellations, refusals of bad input, full queues), by status code.",
      ['model', 'version', 'code'],
    );
    metrics.gauge(
      'circuit_state',
      'Circuit breaker of each model version: 0 closed, 1 half-open, 2 open.',
      ['model', 'version'],
      (gauge: Gauge<'model' | 'version'>) => {
        gauge.reset();
        // Only registered versions: those the registry deleted keep their breaker here but leave the metrics.
        for (const { model, version, breaker } of this.versions.values()) {
          const labels = this.labels.of(model, version);
          if (labels.version !== UNKNOWN_LABEL) gauge.set(labels, STATE_VALUE[breaker.state]);
        }
      },
    );
  }

  /** Runs a request whose version is resolved on the batcher. */
  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    const guarded = this.guardedOf(model, version);
    const { breaker } = guarded;
    const { attempts, baseMs, maxMs } = this.config.retry;
    for (let retry = 0; ; retry++) {
      if (!breaker.tryAcquire()) {
        throw Errors.circuitOpen(
          `model "${model}" version ${version} is failing: its circuit is open after ${this.config.breaker.failureThreshold} consecutive failures; the next attempt goes through in ${Math.ceil(breaker.retryInMs / 1000)} s`,
          { retryDelayMs: breaker.retryInMs },
        );
      }
      const { deadlineMs, signal } = requestContext.current() ?? {};
      const started = this.clock.monotonic();
      const budgetMs = deadlineMs === undefined ? Infinity : deadlineMs - this.clock.now();
      let error: RpcError;
      try {
        const response = await this.batcher.infer(request);
        const ms = this.clock.monotonic() - started;
        guarded.latencyMs =
          guarded.latencyMs === undefined ? ms : (1 - LATENCY_SMOOTHING) * guarded.latencyMs + LATENCY_SMOOTHING * ms;
        breaker.succeeded();
        return response;
      } catch (thrown) {
        error = toRpcError(thrown);
      }
      if (verdictOf(error, budgetMs, guarded.latencyMs, this.config.breaker.timeoutMinBudgetMs) === 'failure') {
        breaker.failed();
      } else {
        // Tells nothing about the version's health: neither a failure nor a success.
        breaker.abandoned();
        this.notCounted.inc({ ...this.labels.of(model, version), code: status[error.code] ?? String(error.code) });
      }
      if (error.code !== status.UNAVAILABLE || retry >= attempts) throw error;
      const delayMs = Math.random() * Math.min(maxMs, baseMs * 2 ** retry);
      if (deadlineMs !== undefined && this.clock.now() + delayMs >= deadlineMs) throw error;
      this.retries.inc({ model: this.labels.model(model) });
      await this.clock.sleep(delayMs, signal).catch(() => {
        throw Errors.cancelled('the call was cancelled');
      });
    }
  }

  private guardedOf(model: string, version: string): GuardedVersion {
    const key = `${model}\u0000${version}`;
    let entry = this.versions.get(key);
    if (entry === undefined) {
      const breaker = new CircuitBreaker({
        failureThreshold: this.config.breaker.failureThreshold,
        cooldownMs: this.config.breaker.cooldownMs,
        clock: this.clock,
        onTransition: (state) => this.transitions.inc({ ...this.labels.of(model, version), state }),
      });
      entry = { model, version, breaker, latencyMs: undefined };
      this.versions.set(key, entry);
    }
    return entry;
  }
}
