import { Errors } from '@infermesh/grpc';
import {
  type AutoRolloutAnalysis,
  AutoRolloutPhase,
  RolloutDecision,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** The most steps an analysis may have. */
const MAX_STEPS = 100;
/** The longest a step may last: a week. */
const MAX_INTERVAL_MS = 7n * 24n * 3_600_000n;

const invalid = (message: string) => Errors.invalidRequest(`auto rollout: ${message}`);

/**
 * Checks an analysis: steps increasing above 0 up to a last step of 100, a positive interval and
 * request count, thresholds that are finite and in range, and an objective when the burn rate is
 * gated. Refuses with INVALID_ARGUMENT naming the field.
 */
export function checkAnalysis(analysis: AutoRolloutAnalysis | undefined): AutoRolloutAnalysis {
  if (analysis === undefined) throw invalid('the request has no analysis (steps, interval, min requests and gates)');
  const { steps } = analysis;
  if (steps.length === 0 || steps.length > MAX_STEPS)
    throw invalid(`steps has ${steps.length} percents; give 1 to ${MAX_STEPS}, the last 100`);
  steps.forEach((percent, i) => {
    if (!Number.isFinite(percent) || percent <= 0 || percent > 100)
      throw invalid(`steps[${i}] is ${percent}; each step is a percent above 0, at most 100`);
    if (i > 0 && percent <= steps[i - 1]!)
      throw invalid(`steps must increase: steps[${i}] is ${percent} after ${steps[i - 1]}`);
  });
  if (steps[steps.length - 1] !== 100)
    throw invalid(
      `the last step is ${steps[steps.length - 1]}; it must be 100 (the canary then takes every request before it is promoted)`,
    );
  if (analysis.intervalMs <= 0n || analysis.intervalMs > MAX_INTERVAL_MS)
    throw invalid(`interval_ms is ${analysis.intervalMs}; it must be from 1 ms to a week`);
  if (analysis.minRequests === 0n) throw invalid('min_requests is 0; a step needs requests to judge the canary on');
  const check = (value: number | undefined, field: string, low: number, high: number) => {
    if (value !== undefined && (!Number.isFinite(value) || value < low || value > high))
      throw invalid(`${field} is ${value}; it must be from ${low} to ${high}`);
  };
  check(analysis.maxErrorRateIncrease, 'max_error_rate_increase', 0, 1);
  check(analysis.maxP99Ratio, 'max_p99_ratio', 1, 1_000);
  check(analysis.minAgreement, 'min_agreement', 0, 1);
  check(analysis.maxBurnRate, 'max_burn_rate', 0, 1_000_000);
  if (analysis.maxBurnRate !== undefined && !(analysis.objective > 0 && analysis.objective < 100)) {
    throw invalid(
      `objective is ${analysis.objective}; max_burn_rate needs the availability objective it burns, a percent above 0 and below 100`,
    );
  }
  return analysis;
}

/** An automatic rollout's phase as metrics and logs label it: progressing, paused, promoted, rolled_back, aborted. */
export function phaseName(phase: AutoRolloutPhase): string {
  return AutoRolloutPhase[phase]?.toLowerCase() ?? String(phase);
}

/** A rollout decision as metrics and logs label it: started, advanced, promoted, rolled_back, ... */
export function decisionName(decision: RolloutDecision): string {
  return RolloutDecision[decision]?.toLowerCase() ?? String(decision);
}
