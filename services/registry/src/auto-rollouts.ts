import { timestampDate } from '@bufbuild/protobuf/wkt';
import { randomUUID } from 'node:crypto';
import { Inject, Injectable, type BeforeApplicationShutdown, type OnApplicationBootstrap } from '@nestjs/common';
import { Errors } from '@infermesh/grpc';
import {
  AutoRolloutPhase,
  type Model,
  type StartAutoRolloutRequest,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { checkAnalysis, decisionName } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import {
  abortAutoRollout,
  applyVerdict,
  figuresOf,
  judgeStep,
  resumeAutoRollout,
  startAutoRollout,
  stableVersionOutside,
  type StepMarks,
  whyNotJudgeable,
} from './auto-rollout';
import { Clock } from '@infermesh/clock';
import { ModelCatalog } from './model-catalog';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';
import { parseModelName } from './resource-name-check';
import { RolloutTraffic } from './rollout-traffic';

/** A step's figures are written back at most this often while it waits (every decision at once). */
const FIGURES_REFRESH_MS = 5_000;

/**
 * Automatic rollouts: starts and resumes them, and on a timer judges every rollout in progress on
 * its step's figures: the canary's share moved on, promoted, or rolled back (auto-rollout.ts
 * decides). Every registry replica judges; a decision is written only when the rollout is still at
 * the step it judged, so replicas never apply one twice. A rollout's state lives with its model, so
 * a restarted registry goes on where it was.
 */
@Injectable()
export class AutoRollouts implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private cancelTimer: (() => void) | undefined;
  private running: Promise<void> | undefined;
  private readonly decisions: Counter<'model' | 'decision'>;
  /** When each rollout step's waiting figures were last written, by rollout id and step. */
  private readonly written = new Map<string, number>();

  constructor(
    private readonly catalog: ModelCatalog,
    private readonly traffic: RolloutTraffic,
    private readonly clock: Clock,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.decisions = metrics.counter(
      'rollout_decisions_total',
      'Decisions of automatic rollouts, by model and decision (started, advanced, promoted, rolled_back, paused, resumed, aborted).',
      ['model', 'decision'],
    );
  }

  onApplicationBootstrap(): void {
    this.cancelTimer = this.clock.setRepeatingTimer(() => void this.tick(), this.config.rollouts.tickMs);
  }

  async beforeApplicationShutdown(): Promise<void> {
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    await this.running;
  }

  /** Starts an automatic rollout, or resumes a paused one. */
  async start(request: StartAutoRolloutRequest): Promise<Model> {
    const modelId = parseModelName(request.model, 'model');
    if (request.resume) {
      if (request.version !== '' || request.analysis !== undefined)
        throw Errors.invalidRequest(
          'auto rollout: resume takes neither a version nor an analysis: it goes on with those of the paused rollout',
        );
      const model = await this.catalog.getModel(request.model);
      const paused = model.autoRollout;
      const marks =
        paused === undefined
          ? { canary: undefined, stable: undefined }
          : await this.marks(modelId, paused.canaryVersion, paused.stableVersion);
      const stored = await this.catalog.changeModel(modelId, (current) =>
        current === undefined ? undefined : resumeAutoRollout(current, marks, this.clock.date()),
      );
      return this.decided(stored!);
    }
    if (request.version === '') throw Errors.invalidRequest('auto rollout: the request names no version to roll out');
    const analysis = checkAnalysis(request.analysis);
    const model = await this.catalog.getModel(request.model);
    const stable = stableVersionOutside(model, request.version) ?? '';
    const marks = await this.marks(modelId, request.version, stable);
    const id = randomUUID();
    const stored = await this.catalog.changeModel(modelId, (current) =>
      current === undefined
        ? undefined
        : startAutoRollout(current, request.version, analysis, id, marks, this.clock.date()),
    );
    return this.decided(stored!);
  }

  /** Judges every rollout in progress, one tick at a time: a tick while one runs is skipped. */
  tick(): Promise<void> {
    if (this.running !== undefined) return this.running;
    this.running = this.judgeAll()
      .catch((error: unknown) =>
        this.logger.warn('automatic rollouts: judging failed; trying again', {
          err: error instanceof Error ? error.message : String(error),
        }),
      )
      .finally(() => (this.running = undefined));
    return this.running;
  }

  private async judgeAll(): Promise<void> {
    const models = await this.catalog.listModels();
    for (const model of models) {
      if (model.autoRollout?.phase !== AutoRolloutPhase.PROGRESSING) continue;
      await this.judge(model).catch((error: unknown) =>
        this.logger.warn('automatic rollout: cannot judge the step; trying again', {
          model: model.name,
          err: error instanceof Error ? error.message : String(error),
        }),
      );
    }
    const live = new Set(models.map((m) => `${m.autoRollout?.id}/${m.autoRollout?.step}`));
    for (const key of this.written.keys()) if (!live.has(key)) this.written.delete(key);
  }

  private async judge(model: Model): Promise<void> {
    const rollout = model.autoRollout!;
    const modelId = model.name.slice('models/'.length);
    const now = this.clock.date();
    const why = whyNotJudgeable(model, rollout);
    if (why !== undefined) {
      let aborted = false;
      const stored = await this.catalog.changeModel(modelId, (current) => {
        aborted = current !== undefined && abortAutoRollout(current, rollout.id, why, now);
        return aborted ? current : undefined;
      });
      if (aborted && stored !== undefined) this.decided(stored);
      return;
    }
    const stepStart = timestampDate(rollout.stepStartTime!);
    const [canary, stable] = await Promise.all([
      this.traffic.since(modelId, rollout.canaryVersion, rollout.canaryBaseline, stepStart, now),
      this.traffic.since(modelId, rollout.stableVersion, rollout.stableBaseline, stepStart, now),
    ]);
    const { figures, verdict } = judgeStep(
      rollout,
      figuresOf(rollout.canaryVersion, canary, this.traffic.latencyBoundsSeconds),
      figuresOf(rollout.stableVersion, stable, this.traffic.latencyBoundsSeconds),
      now,
    );
    const key = `${rollout.id}/${rollout.step}`;
    if (verdict.kind === 'wait') {
      const last = this.written.get(key);
      if (last !== undefined && now.getTime() - last < FIGURES_REFRESH_MS) return;
      this.written.set(key, now.getTime());
    }
    const marks =
      verdict.kind === 'advance'
        ? await this.marks(modelId, rollout.canaryVersion, rollout.stableVersion)
        : { canary: undefined, stable: undefined };
    let applied = false;
    const stored = await this.catalog.changeModel(modelId, (current) => {
      applied =
        current !== undefined &&
        applyVerdict(current, { id: rollout.id, step: rollout.step }, figures, verdict, marks, now);
      return applied ? current : undefined;
    });
    if (!applied || stored === undefined || verdict.kind === 'wait') return;
    this.decided(stored);
    if (verdict.kind === 'promote') await this.retire(modelId, rollout.stableVersion);
  }

  /** After a promotion the old stable version drains; one the version policy still serves stays, with a log line saying so. */
  private async retire(modelId: string, versionId: string): Promise<void> {
    try {
      await this.catalog.retireVersion(`models/${modelId}/versions/${versionId}`);
    } catch (error) {
      this.logger.info('automatic rollout: the old stable version stays', {
        model: modelId,
        version: versionId,
        why: error instanceof Error ? error.message : String(error),
      });
    }
  }

  private async marks(modelId: string, canary: string, stable: string): Promise<StepMarks> {
    const [c, s] = await Promise.all([
      this.traffic.mark(modelId, canary),
      stable === '' ? undefined : this.traffic.mark(modelId, stable),
    ]);
    return { canary: c, stable: s };
  }

  /** Counts and logs the decision the model's last event records; returns the model. */
  private decided(model: Model): Model {
    const event = model.rolloutHistory.at(-1);
    const decision = event === undefined ? 'none' : decisionName(event.decision);
    this.decisions.inc({ model: model.name.slice('models/'.length), decision });
    this.logger.info('automatic rollout', {
      model: model.name,
      decision,
      version: event?.version,
      step: event === undefined ? undefined : event.step + 1,
      percent: event?.percent,
      reason: event?.reason,
    });
    return model;
  }
}
