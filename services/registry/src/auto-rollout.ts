import { create } from '@bufbuild/protobuf';
import { timestampDate, timestampFromDate } from '@bufbuild/protobuf/wkt';
import { Errors } from '@infermesh/grpc';
import {
  type AutoRollout,
  type AutoRolloutAnalysis,
  AutoRolloutPhase,
  AutoRolloutSchema,
  type GateResult,
  GateResultSchema,
  type Model,
  RolloutDecision,
  RolloutEventSchema,
  RolloutPolicySchema,
  type StepFigures,
  StepFiguresSchema,
  type TrafficCounters,
  type VersionFigures,
  VersionFiguresSchema,
  VersionState,
  WeightedVersionSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { latencyQuantileMs, stableVersion, versionIdOf, phaseName } from '@infermesh/rollout';
import { applyRolloutAction } from './rollout-actions';
import { checkRollout } from './rollout-check';

/** The decisions a model keeps in rollout_history: the oldest go first. */
export const MAX_ROLLOUT_EVENTS = 100;

/** Whether an automatic rollout still runs or may run again (a paused one resumes). */
export function isActive(rollout: AutoRollout | undefined): rollout is AutoRollout {
  return rollout?.phase === AutoRolloutPhase.PROGRESSING || rollout?.phase === AutoRolloutPhase.PAUSED;
}

/** A version's figures from its counters over a step, their latencies counted under `bounds`. */
export function figuresOf(version: string, counters: TrafficCounters, bounds: readonly number[]): VersionFigures {
  const requests = Number(counters.requests);
  const items = Number(counters.shadowItems);
  return create(VersionFiguresSchema, {
    version,
    requests: counters.requests,
    errors: counters.failures,
    errorRate: requests === 0 ? 0 : Number(counters.failures) / requests,
    serviceErrors: counters.errors,
    serviceErrorRate: requests === 0 ? 0 : Number(counters.errors) / requests,
    p99Ms: latencyQuantileMs(counters.latencyCounts, bounds, 0.99),
    shadowItems: counters.shadowItems,
    agreement: items === 0 ? 0 : Number(counters.shadowAgreed) / items,
  });
}

/** What the registry does with a step after looking at its figures. */
export type StepVerdict =
  | { readonly kind: 'wait'; readonly reason: string }
  | { readonly kind: 'advance' | 'promote'; readonly reason: string }
  | { readonly kind: 'roll_back'; readonly reason: string };

/**
 * Judges the current step: the gates once the canary has served min_requests in it (a failed one
 * rolls back at once; the latency gate only once the interval has passed, see checkGates), then the
 * interval. The stable version's figures are its own over the step, or the reference from the last
 * step where it served min_requests when it served fewer, or when the step gives it no traffic: what
 * it reports then is the last requests of the step before, counted late (routers report every few
 * seconds), a sample biased to whatever was in flight at the switch.
 */
export function judgeStep(
  rollout: AutoRollout,
  canary: VersionFigures,
  stable: VersionFigures,
  now: Date,
): { figures: StepFigures; verdict: StepVerdict } {
  const analysis = rollout.analysis!;
  const elapsedMs = now.getTime() - timestampDate(rollout.stepStartTime!).getTime();
  const leftMs = Number(analysis.intervalMs) - elapsedMs;
  const reference =
    isFullStep(rollout, stable) || rollout.stableReference === undefined ? stable : rollout.stableReference;
  const gates =
    canary.requests >= analysis.minRequests
      ? checkGates(analysis, canary, reference, { fromEarlierStep: reference !== stable, stepLeftMs: leftMs })
      : [];
  const figures = create(StepFiguresSchema, { canary, stable, gates, elapsedMs: BigInt(Math.max(0, elapsedMs)) });
  const failed = gates.find((g) => g.checked && !g.passed);
  if (failed !== undefined)
    return { figures, verdict: { kind: 'roll_back', reason: `${failed.gate} gate failed: ${failed.note}` } };
  if (canary.requests < analysis.minRequests) {
    return {
      figures,
      verdict: {
        kind: 'wait',
        reason: `waiting for requests: the canary served ${canary.requests} of ${analysis.minRequests} in this step`,
      },
    };
  }
  if (leftMs > 0)
    return {
      figures,
      verdict: { kind: 'wait', reason: `gates hold; the step lasts ${Math.ceil(leftMs / 1000)} s more` },
    };
  const last = rollout.step + 1 >= analysis.steps.length;
  return {
    figures,
    verdict: last
      ? { kind: 'promote', reason: `every step passed; the last with ${canary.requests} canary requests` }
      : { kind: 'advance', reason: `step ${rollout.step + 1} passed with ${canary.requests} canary requests` },
  };
}

/** Whether the stable version's figures over the current step are its own: the step gives it traffic, and it served min_requests. */
function isFullStep(rollout: AutoRollout, stable: VersionFigures): boolean {
  const analysis = rollout.analysis!;
  return analysis.steps[rollout.step]! < 100 && stable.requests >= analysis.minRequests;
}

/**
 * The gates on the step's figures. The error gates are judged whenever they are read. The latency
 * gate is judged only once the step's interval has passed (`stepLeftMs` ≤ 0), over the whole step: a
 * pause of any process on the path delays every request in flight at once, and over the few hundred
 * requests a step has served early on, those few make its p99 (a healthy canary read 4.8× its
 * stable version's 400 ms into a 1.5 s step of test/e2e/auto-rollout.e2e.spec.ts). Judged at every
 * check, the gate would fail a canary on any part of a step that one pause fell in.
 */
function checkGates(
  analysis: AutoRolloutAnalysis,
  canary: VersionFigures,
  stable: VersionFigures,
  step: { readonly fromEarlierStep: boolean; readonly stepLeftMs: number },
): GateResult[] {
  const gates: GateResult[] = [];
  const stableName = `stable version ${stable.version}${step.fromEarlierStep ? ' (its last full step)' : ''}`;
  const pct = (rate: number) => `${(rate * 100).toFixed(2)} %`;
  if (analysis.maxErrorRateIncrease !== undefined) {
    const increase = canary.errorRate - stable.errorRate;
    gates.push(
      create(GateResultSchema, {
        gate: 'error_rate_increase',
        checked: true,
        passed: increase <= analysis.maxErrorRateIncrease,
        value: increase,
        threshold: analysis.maxErrorRateIncrease,
        note: `canary error rate ${pct(canary.errorRate)} (${canary.errors} of ${canary.requests}) against ${pct(stable.errorRate)} of the ${stableName}; at most ${pct(analysis.maxErrorRateIncrease)} more is allowed`,
      }),
    );
  }
  if (analysis.maxP99Ratio !== undefined) {
    if (canary.p99Ms === 0 || stable.p99Ms === 0) {
      const whose = canary.p99Ms === 0 ? 'the canary' : `the ${stableName}`;
      gates.push(
        create(GateResultSchema, {
          gate: 'p99_ratio',
          checked: false,
          threshold: analysis.maxP99Ratio,
          note: `no successful request of ${whose} to time`,
        }),
      );
    } else {
      const ratio = canary.p99Ms / stable.p99Ms;
      const judged = step.stepLeftMs <= 0;
      gates.push(
        create(GateResultSchema, {
          gate: 'p99_ratio',
          checked: judged,
          passed: judged && ratio <= analysis.maxP99Ratio,
          value: ratio,
          threshold: analysis.maxP99Ratio,
          note: judged
            ? `canary p99 ${canary.p99Ms.toFixed(1)} ms against ${stable.p99Ms.toFixed(1)} ms of the ${stableName}: ${ratio.toFixed(2)}×, at most ${analysis.maxP99Ratio}× allowed`
            : `judged over the whole step, once its interval has passed (${Math.ceil(step.stepLeftMs / 1000)} s more); ${ratio.toFixed(2)}× so far`,
        }),
      );
    }
  }
  if (analysis.minAgreement !== undefined) {
    gates.push(
      canary.shadowItems === 0n
        ? create(GateResultSchema, {
            gate: 'agreement',
            checked: false,
            threshold: analysis.minAgreement,
            note: 'no shadow comparison of the canary in this step',
          })
        : create(GateResultSchema, {
            gate: 'agreement',
            checked: true,
            passed: canary.agreement >= analysis.minAgreement,
            value: canary.agreement,
            threshold: analysis.minAgreement,
            note: `the canary agreed on ${pct(canary.agreement)} of ${canary.shadowItems} shadow-compared items; at least ${pct(analysis.minAgreement)} needed`,
          }),
    );
  }
  if (analysis.maxBurnRate !== undefined) {
    const burn = canary.serviceErrorRate / (1 - analysis.objective / 100);
    gates.push(
      create(GateResultSchema, {
        gate: 'burn_rate',
        checked: true,
        passed: burn <= analysis.maxBurnRate,
        value: burn,
        threshold: analysis.maxBurnRate,
        note: `the canary burns its ${analysis.objective} % availability budget ${burn.toFixed(2)}× as fast as it lasts (errors of the service: ${pct(canary.serviceErrorRate)}); at most ${analysis.maxBurnRate}× allowed`,
      }),
    );
  }
  return gates;
}

/** The baselines of the two versions when a step starts (the ledger's counts; none from Prometheus). */
export interface StepMarks {
  readonly canary: TrafficCounters | undefined;
  readonly stable: TrafficCounters | undefined;
}

/**
 * Starts an automatic rollout of `versionId` on the model as it is now (mutated and returned): the
 * stable version pinned (the policy's, else the latest READY one), the canary at the first step's
 * percent, the rest of the policy kept. A paused rollout it replaces is aborted. Refused while
 * another one is in progress, for a version that is not READY, or for the stable version itself.
 */
export function startAutoRollout(
  model: Model,
  versionId: string,
  analysis: AutoRolloutAnalysis,
  id: string,
  marks: StepMarks,
  now: Date,
): Model {
  const modelId = model.name.slice('models/'.length);
  if (model.autoRollout?.phase === AutoRolloutPhase.PROGRESSING) {
    const current = model.autoRollout;
    throw Errors.rolloutInProgress(
      `auto rollout: model "${modelId}" already has one in progress (version ${current.canaryVersion}); pause it (rollout pause) or let it end first`,
      { metadata: { model: modelId, version: current.canaryVersion } },
    );
  }
  const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
  if (version === undefined)
    throw Errors.versionNotFound(`model "${modelId}" has no version ${versionId}`, {
      metadata: {
        model: modelId,
        version: versionId,
      },
    });
  if (version.state !== VersionState.READY) {
    throw Errors.versionNotReady(
      `auto rollout: version ${versionId} of model "${modelId}" is ${VersionState[version.state]}; it must be READY (loaded and warmed up) to take traffic`,
      { metadata: { model: modelId, version: versionId } },
    );
  }
  const stable = stableVersionOutside(model, versionId);
  if (stable === undefined) {
    throw Errors.noStableVersion(
      `auto rollout: model "${modelId}" has no READY stable version besides ${versionId} to compare the canary with; pin the serving version (rollout stable) before registering the next one, so that it keeps serving`,
      { metadata: { model: modelId, version: versionId } },
    );
  }
  if (model.autoRollout?.phase === AutoRolloutPhase.PAUSED)
    abortAutoRollout(model, model.autoRollout.id, `replaced by an automatic rollout of version ${versionId}`, now);
  const current = model.rollout ?? create(RolloutPolicySchema);
  model.rollout = checkRollout(
    create(RolloutPolicySchema, {
      ...current,
      stableVersion: stable,
      canary: create(WeightedVersionSchema, { version: versionId, percent: analysis.steps[0]! }),
      variants: current.variants.filter((v) => v.version !== versionId),
    }),
    model,
  );
  model.autoRollout = create(AutoRolloutSchema, {
    id,
    canaryVersion: versionId,
    stableVersion: stable,
    analysis,
    phase: AutoRolloutPhase.PROGRESSING,
    step: 0,
    startTime: timestampFromDate(now),
    stepStartTime: timestampFromDate(now),
    updateTime: timestampFromDate(now),
    reason: 'started',
    ...(marks.canary !== undefined && { canaryBaseline: marks.canary }),
    ...(marks.stable !== undefined && { stableBaseline: marks.stable }),
  });
  version.rollbackReason = '';
  record(
    model,
    RolloutDecision.STARTED,
    `version ${versionId} against stable version ${stable}, steps ${analysis.steps.join(', ')} %`,
    now,
  );
  return model;
}

/** The version the canary is compared with: the policy's stable version, else the latest READY one, never the canary. */
export function stableVersionOutside(model: Model, canary: string): string | undefined {
  const pinned = model.rollout?.stableVersion ?? '';
  if (pinned !== '' && pinned !== canary)
    return model.versions.some((v) => versionIdOf(v.name) === pinned && v.state === VersionState.READY)
      ? pinned
      : undefined;
  const latest = stableVersion(model);
  if (latest !== undefined && versionIdOf(latest.name) !== canary) return versionIdOf(latest.name);
  const others = model.versions.filter((v) => v.state === VersionState.READY && versionIdOf(v.name) !== canary);
  return others.length === 0 ? undefined : versionIdOf(others[others.length - 1]!.name);
}

/** Resumes a paused rollout at its step, which starts again (new baselines, the step's percent set back). */
export function resumeAutoRollout(model: Model, marks: StepMarks, now: Date): Model {
  const modelId = model.name.slice('models/'.length);
  const rollout = model.autoRollout;
  if (rollout?.phase !== AutoRolloutPhase.PAUSED) {
    throw Errors.noPausedRollout(
      `auto rollout: model "${modelId}" has no paused automatic rollout to resume${rollout === undefined ? '' : ` (it is ${phaseName(rollout.phase)})`}`,
      { metadata: { model: modelId } },
    );
  }
  if (model.rollout?.canary?.version !== rollout.canaryVersion) {
    throw Errors.canaryReplaced(
      `auto rollout: version ${rollout.canaryVersion} is no longer the canary of model "${modelId}" (a manual change replaced it); start a new automatic rollout`,
      { metadata: { model: modelId, version: rollout.canaryVersion } },
    );
  }
  model.rollout = checkRollout(withCanaryPercent(model, rollout.analysis!.steps[rollout.step]!), model);
  startStep(rollout, rollout.step, marks, now);
  rollout.phase = AutoRolloutPhase.PROGRESSING;
  rollout.reason = 'resumed';
  record(model, RolloutDecision.RESUMED, `at step ${rollout.step + 1} of ${rollout.analysis!.steps.length}`, now);
  return model;
}

/**
 * Pauses the model's rollout when it is in progress (a manual rollout change was made: `why`);
 * returns whether it did. The policy is left as the change made it.
 */
export function pauseAutoRollout(model: Model, why: string, now: Date): boolean {
  const rollout = model.autoRollout;
  if (rollout?.phase !== AutoRolloutPhase.PROGRESSING) return false;
  rollout.phase = AutoRolloutPhase.PAUSED;
  rollout.reason = why;
  rollout.updateTime = timestampFromDate(now);
  record(model, RolloutDecision.PAUSED, why, now);
  return true;
}

/**
 * Applies a verdict on the step `expected` judged (its id and step still current and in progress,
 * else nothing changes: another replica got there first): the figures recorded, and the canary's
 * share moved, promoted or rolled back. Returns whether the model changed.
 */
export function applyVerdict(
  model: Model,
  expected: { id: string; step: number },
  figures: StepFigures,
  verdict: StepVerdict,
  marks: StepMarks,
  now: Date,
): boolean {
  const rollout = model.autoRollout;
  if (
    rollout === undefined ||
    rollout.id !== expected.id ||
    rollout.step !== expected.step ||
    rollout.phase !== AutoRolloutPhase.PROGRESSING
  )
    return false;
  rollout.figures = figures;
  rollout.reason = verdict.reason;
  rollout.updateTime = timestampFromDate(now);
  switch (verdict.kind) {
    case 'wait':
      return true;
    case 'advance': {
      if (figures.stable !== undefined && isFullStep(rollout, figures.stable)) rollout.stableReference = figures.stable;
      const next = rollout.step + 1;
      model.rollout = checkRollout(withCanaryPercent(model, rollout.analysis!.steps[next]!), model);
      startStep(rollout, next, marks, now);
      record(model, RolloutDecision.ADVANCED, verdict.reason, now, figures);
      return true;
    }
    case 'promote':
      model.rollout = checkRollout(applyRolloutAction(model, { case: 'promote', value: rollout.canaryVersion }), model);
      rollout.phase = AutoRolloutPhase.PROMOTED;
      record(model, RolloutDecision.PROMOTED, verdict.reason, now, figures);
      return true;
    case 'roll_back':
      model.rollout = checkRollout(applyRolloutAction(model, { case: 'rollback', value: true }), model);
      rollout.phase = AutoRolloutPhase.ROLLED_BACK;
      for (const version of model.versions)
        if (versionIdOf(version.name) === rollout.canaryVersion) version.rollbackReason = verdict.reason;
      record(model, RolloutDecision.ROLLED_BACK, verdict.reason, now, figures);
      return true;
  }
}

/**
 * Ends a rollout that can no longer be judged, the policy left as it is: `why` says which version
 * left. Returns whether it did (the same id still in progress or paused).
 */
export function abortAutoRollout(model: Model, id: string, why: string, now: Date): boolean {
  const rollout = model.autoRollout;
  if (rollout?.id !== id || !isActive(rollout)) return false;
  rollout.phase = AutoRolloutPhase.ABORTED;
  rollout.reason = why;
  rollout.updateTime = timestampFromDate(now);
  record(model, RolloutDecision.ABORTED, why, now);
  return true;
}

/** Why a rollout in progress cannot go on with the model as it is, or undefined when it can. */
export function whyNotJudgeable(model: Model, rollout: AutoRollout): string | undefined {
  const state = (versionId: string) => model.versions.find((v) => versionIdOf(v.name) === versionId)?.state;
  const canary = state(rollout.canaryVersion);
  if (canary !== VersionState.READY)
    return `the canary, version ${rollout.canaryVersion}, is ${canary === undefined ? 'gone' : VersionState[canary]}`;
  const stable = state(rollout.stableVersion);
  if (stable !== VersionState.READY)
    return `the stable version ${rollout.stableVersion} is ${stable === undefined ? 'gone' : VersionState[stable]}`;
  if (model.rollout?.canary?.version !== rollout.canaryVersion)
    return `version ${rollout.canaryVersion} is no longer the canary`;
  return undefined;
}

function withCanaryPercent(model: Model, percent: number) {
  const policy = model.rollout ?? create(RolloutPolicySchema);
  return create(RolloutPolicySchema, {
    ...policy,
    canary: create(WeightedVersionSchema, { version: policy.canary!.version, percent }),
  });
}

function startStep(rollout: AutoRollout, step: number, marks: StepMarks, now: Date): void {
  rollout.step = step;
  rollout.stepStartTime = timestampFromDate(now);
  rollout.updateTime = timestampFromDate(now);
  rollout.canaryBaseline = marks.canary;
  rollout.stableBaseline = marks.stable;
  rollout.figures = undefined;
}

function record(model: Model, decision: RolloutDecision, reason: string, now: Date, figures?: StepFigures): void {
  const rollout = model.autoRollout!;
  model.rolloutHistory.push(
    create(RolloutEventSchema, {
      time: timestampFromDate(now),
      rolloutId: rollout.id,
      version: rollout.canaryVersion,
      decision,
      step: rollout.step,
      percent:
        model.rollout?.canary?.version === rollout.canaryVersion
          ? model.rollout.canary.percent
          : decision === RolloutDecision.PROMOTED
            ? 100
            : 0,
      reason,
      ...(figures !== undefined && { figures }),
    }),
  );
  if (model.rolloutHistory.length > MAX_ROLLOUT_EVENTS)
    model.rolloutHistory.splice(0, model.rolloutHistory.length - MAX_ROLLOUT_EVENTS);
}
