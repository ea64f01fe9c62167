import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type AutoRolloutAnalysisSchema,
  AutoRolloutPhase,
  CreateModelVersionRequestSchema,
  type Model,
  RolloutDecision,
  RolloutPolicySchema,
  SetWeightsSchema,
  StartAutoRolloutRequestSchema,
  TrafficCountersSchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { emptyCounters, latencyIndex, ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { ManualClock, rpcRejection } from '@infermesh/testing';
import { AutoRollouts } from './auto-rollouts';
import type { ModelCatalog } from './model-catalog';
import { type TestCatalog, openTestCatalog } from './model-catalog.testing';
import { LedgerRolloutTraffic } from './rollout-traffic';
import { EmbeddedTrafficLedger } from './traffic-ledger';
import { RETIRING_REASON } from './version-lifecycle';

const INTERVAL_MS = 10_000;

describe(AutoRollouts.name, () => {
  let clock: ManualClock;
  let catalog: ModelCatalog;
  let ledger: EmbeddedTrafficLedger;
  let metrics: Metrics;
  let opened: TestCatalog;
  let sut: AutoRollouts;

  beforeEach(async () => {
    clock = new ManualClock();
    opened = await openTestCatalog(clock);
    ({ catalog, metrics } = opened);
    const { config, logger, sha256 } = opened;
    ledger = new EmbeddedTrafficLedger();
    sut = new AutoRollouts(catalog, new LedgerRolloutTraffic(ledger), clock, config, logger, metrics);
    // Version 1 serves; the stable version is pinned before version 2 arrives (so 1 keeps serving).
    const register = async (versionId: string) => {
      await catalog.createVersion(
        create(CreateModelVersionRequestSchema, { parent: 'models/tiny', versionId, artifactSha256: sha256 }),
      );
      await catalog.reportState(`models/tiny/versions/${versionId}`, VersionState.READY, '', 'worker-1');
    };
    await register('1');
    await catalog.setRollout('models/tiny', create(RolloutPolicySchema, { stableVersion: '1' }));
    await register('2');
  });

  afterEach(async () => {
    await sut.beforeApplicationShutdown();
    await opened.close();
  });

  const start = (analysis: MessageInitShape<typeof AutoRolloutAnalysisSchema> = {}) =>
    sut.start(
      create(StartAutoRolloutRequestSchema, {
        model: 'models/tiny',
        version: '2',
        analysis: {
          steps: [10, 50, 100],
          intervalMs: BigInt(INTERVAL_MS),
          minRequests: 100n,
          maxErrorRateIncrease: 0.01,
          maxP99Ratio: 1.5,
          ...analysis,
        },
      }),
    );

  /** What routers report a version served: `requests`, `errors` of them, the successes taking `latencyMs`. */
  const serve = (versionId: string, requests: number, errors = 0, latencyMs = 4) => {
    const counters = emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS);
    counters.latencyCounts[latencyIndex(latencyMs / 1000, ROLLOUT_LATENCY_BOUNDS_SECONDS)] = BigInt(requests - errors);
    return ledger.add([
      {
        modelId: 'tiny',
        versionId,
        counters: create(TrafficCountersSchema, {
          ...counters,
          requests: BigInt(requests),
          errors: BigInt(errors),
          failures: BigInt(errors),
        }),
      },
    ]);
  };
  const model = (): Promise<Model> => catalog.getModel('models/tiny');
  const decisions = async () =>
    (await model()).rolloutHistory.map((e) => `${RolloutDecision[e.decision]} ${e.percent}`);
  const phase = async () => AutoRolloutPhase[(await model()).autoRollout?.phase ?? AutoRolloutPhase.UNSPECIFIED];
  const canaryPercent = async () => (await model()).rollout?.canary?.percent;

  it('pins the stable version and gives the canary the first step', async () => {
    const started = await start();

    expect(started.rollout?.stableVersion).toBe('1');
    expect(started.rollout?.canary).toMatchObject({ version: '2', percent: 10 });
    expect(started.autoRollout).toMatchObject({
      canaryVersion: '2',
      stableVersion: '1',
      phase: AutoRolloutPhase.PROGRESSING,
      step: 0,
    });
    expect(await decisions()).toEqual(['STARTED 10']);
  });

  it('promotes a canary that holds up through every step, then retires the old stable version', async () => {
    await start();
    for (const percent of [10, 50, 100]) {
      expect(await canaryPercent()).toBe(percent);
      await serve('2', 200);
      if (percent < 100) await serve('1', 800);
      clock.advance(INTERVAL_MS);
      await sut.tick();
    }

    const promoted = await model();
    expect(promoted.autoRollout?.phase).toBe(AutoRolloutPhase.PROMOTED);
    expect(promoted.rollout?.stableVersion).toBe('2');
    expect(promoted.rollout?.canary).toBeUndefined();
    expect(promoted.versions.find((v) => v.name.endsWith('/1'))).toMatchObject({
      state: VersionState.DRAINING,
      stateReason: RETIRING_REASON,
    });
    expect(await decisions()).toEqual(['STARTED 10', 'ADVANCED 50', 'ADVANCED 100', 'PROMOTED 100']);
    // At the last step the stable version served nothing: the canary was compared with its last full step.
    const last = promoted.rolloutHistory.at(-1)!.figures!;
    expect(last.stable?.requests).toBe(0n);
    expect(last.gates.find((g) => g.gate === 'p99_ratio')).toMatchObject({ checked: true, passed: true });
    expect(last.gates.find((g) => g.gate === 'error_rate_increase')?.note).toContain('its last full step');
    const scraped = await metrics.registry.metrics();
    expect(scraped).toMatch(/_rollout_decisions_total\{model="tiny",decision="promoted"\} 1/);
    expect(scraped).toMatch(/_rollout_phase\{model="tiny",phase="promoted"\} 1/);
    expect(scraped).toMatch(/_rollout_phase\{model="tiny",phase="progressing"\} 0/);
  });

  it("compares the last step with the stable version's last full step, whatever it reports of requests it served before", async () => {
    await start();
    for (const percent of [10, 50]) {
      expect(await canaryPercent()).toBe(percent);
      await serve('2', 500, 0, 20);
      await serve('1', 500, 0, 20);
      clock.advance(INTERVAL_MS);
      await sut.tick();
    }
    expect(await canaryPercent()).toBe(100);
    // Routers report what they counted every few seconds: the stable version's last requests of the
    // previous step, the quick ones, arrive in this one, more than min_requests of them.
    await serve('1', 150, 0, 5);
    await serve('2', 500, 0, 20);
    clock.advance(INTERVAL_MS);
    await sut.tick();

    const promoted = await model();
    expect(promoted.autoRollout?.phase).toBe(AutoRolloutPhase.PROMOTED);
    const gate = promoted.rolloutHistory.at(-1)!.figures!.gates.find((g) => g.gate === 'p99_ratio')!;
    expect(gate.note).toContain('its last full step');
    expect(gate.value).toBeCloseTo(1);
  });

  it('holds a step until the canary has served min_requests, even past the interval', async () => {
    await start();
    await serve('2', 40);
    clock.advance(INTERVAL_MS * 3);
    await sut.tick();

    expect(await canaryPercent()).toBe(10);
    expect((await model()).autoRollout?.reason).toBe('waiting for requests: the canary served 40 of 100 in this step');

    await serve('2', 60);
    await sut.tick();
    expect(await canaryPercent()).toBe(50);
  });

  it('holds a step for its interval while the gates hold', async () => {
    await start();
    await serve('2', 500);
    await serve('1', 500);
    clock.advance(INTERVAL_MS - 1);
    await sut.tick();

    expect(await canaryPercent()).toBe(10);
    const gates = (await model()).autoRollout!.figures!.gates;
    expect(gates.find((g) => g.gate === 'error_rate_increase')).toMatchObject({ checked: true, passed: true });
    expect(gates.find((g) => g.gate === 'p99_ratio')).toMatchObject({ checked: false, value: 1 });
  });

  it('rolls back at once, without waiting for the interval, when the canary fails more than the stable version', async () => {
    await start();
    await serve('1', 900, 1);
    await serve('2', 100, 8);
    await sut.tick();

    const rolledBack = await model();
    expect(rolledBack.autoRollout?.phase).toBe(AutoRolloutPhase.ROLLED_BACK);
    expect(rolledBack.rollout?.canary).toBeUndefined();
    expect(rolledBack.rollout?.stableVersion).toBe('1');
    const reason = rolledBack.versions.find((v) => v.name.endsWith('/2'))!.rollbackReason;
    expect(reason).toMatch(
      /^error_rate_increase gate failed: canary error rate 8\.00 % \(8 of 100\) against 0\.11 % of the stable version 1/,
    );
    expect(await decisions()).toEqual(['STARTED 10', 'ROLLED_BACK 0']);
    // Nothing more happens once it ended.
    await serve('2', 1_000);
    clock.advance(INTERVAL_MS);
    await sut.tick();
    expect(await decisions()).toEqual(['STARTED 10', 'ROLLED_BACK 0']);
  });

  it('rolls back a canary much slower than the stable version on the latency gate, once its step has lasted the interval', async () => {
    await start();
    await serve('1', 900, 0, 4);
    await serve('2', 100, 0, 40);
    await sut.tick();
    expect(await phase()).toBe('PROGRESSING');
    expect((await model()).autoRollout!.figures!.gates.find((g) => g.gate === 'p99_ratio')!.note).toMatch(
      /^judged over the whole step, once its interval has passed \(10 s more\); \d+\.\d\d× so far$/,
    );

    clock.advance(INTERVAL_MS);
    await sut.tick();
    const gate = (await model()).autoRollout!.figures!.gates.find((g) => g.gate === 'p99_ratio')!;
    expect(await phase()).toBe('ROLLED_BACK');
    expect(gate).toMatchObject({ checked: true, passed: false, threshold: 1.5 });
    expect(gate.value).toBeGreaterThan(5);
  });

  it('judges the latency gate on the whole step, not on a stall in its first requests', async () => {
    await start();
    await serve('1', 900, 0, 4);
    // One pause delayed the few requests then in flight: 5 % of the canary's first 100.
    await serve('2', 5, 0, 40);
    await serve('2', 95, 0, 4);
    await sut.tick();
    expect(await phase()).toBe('PROGRESSING');

    await serve('1', 8_100, 0, 4);
    await serve('2', 900, 0, 4);
    clock.advance(INTERVAL_MS);
    await sut.tick();
    expect(await decisions()).toEqual(['STARTED 10', 'ADVANCED 50']);
    const gate = (await model()).rolloutHistory.at(-1)!.figures!.gates.find((g) => g.gate === 'p99_ratio')!;
    expect(gate).toMatchObject({ checked: true, passed: true });
  });

  it('gates on shadow agreement only when the step compared any items', async () => {
    await start({ minAgreement: 0.99 });
    await serve('2', 100);
    await serve('1', 900);
    await sut.tick();
    expect((await model()).autoRollout!.figures!.gates.find((g) => g.gate === 'agreement')).toMatchObject({
      checked: false,
      note: 'no shadow comparison of the canary in this step',
    });

    await ledger.add([
      {
        modelId: 'tiny',
        versionId: '2',
        counters: create(TrafficCountersSchema, { shadowItems: 100n, shadowAgreed: 90n }),
      },
    ]);
    await sut.tick();
    expect(await phase()).toBe('ROLLED_BACK');
    expect((await model()).versions.find((v) => v.name.endsWith('/2'))!.rollbackReason).toContain(
      'the canary agreed on 90.00 % of 100 shadow-compared items',
    );
  });

  it('rolls back on the burn rate of the canary against the objective', async () => {
    await start({ maxErrorRateIncrease: undefined, maxBurnRate: 2, objective: 99 });
    await serve('2', 100, 3);
    await sut.tick();

    expect(await phase()).toBe('ROLLED_BACK');
  });

  it('is paused by a manual rollout change, and resumes its step from the start', async () => {
    await start();
    await catalog.updateRollout('models/tiny', {
      case: 'setWeights',
      value: create(SetWeightsSchema, { percents: { '2': 30 } }),
    });
    expect(await phase()).toBe('PAUSED');
    await serve('2', 500);
    clock.advance(INTERVAL_MS);
    await sut.tick();
    expect(await canaryPercent()).toBe(30);

    await sut.start(create(StartAutoRolloutRequestSchema, { model: 'models/tiny', resume: true }));
    expect(await phase()).toBe('PROGRESSING');
    expect(await canaryPercent()).toBe(10);
    // The step starts again: what the canary served while paused does not count.
    await sut.tick();
    expect((await model()).autoRollout?.reason).toBe('waiting for requests: the canary served 0 of 100 in this step');
    expect(await decisions()).toEqual(['STARTED 10', 'PAUSED 30', 'RESUMED 10']);
  });

  it('pauses on the pause action, which needs a rollout in progress', async () => {
    expect(await rpcRejection(catalog.updateRollout('models/tiny', { case: 'pause', value: true }))).toMatchObject({
      code: status.FAILED_PRECONDITION,
      reason: 'NO_ROLLOUT_IN_PROGRESS',
    });
    await start();
    const paused = await catalog.updateRollout('models/tiny', { case: 'pause', value: true });
    expect(paused.autoRollout?.reason).toBe('paused');
    expect(paused.rollout?.canary).toMatchObject({ version: '2', percent: 10 });
  });

  it('aborts when the canary stops being READY', async () => {
    await start();
    await catalog.reportState('models/tiny/versions/2', VersionState.FAILED, 'out of memory', 'worker-1');
    await sut.tick();

    expect((await model()).autoRollout).toMatchObject({
      phase: AutoRolloutPhase.ABORTED,
      reason: 'the canary, version 2, is FAILED',
    });
  });

  it('measures a step from its start, and from zero when the counts restarted below it', async () => {
    await serve('2', 1_000, 500);
    await start();
    await sut.tick();
    expect(await phase()).toBe('PROGRESSING');

    // An embedded ledger restarts with the registry: counts below the step's baseline are all new.
    const restarted = new EmbeddedTrafficLedger();
    const after = new AutoRollouts(
      catalog,
      new LedgerRolloutTraffic(restarted),
      clock,
      opened.config,
      new JsonLogger('test', 'error'),
      new Metrics('test'),
    );
    await restarted.add([
      {
        modelId: 'tiny',
        versionId: '2',
        counters: create(TrafficCountersSchema, {
          ...emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS),
          requests: 100n,
          errors: 50n,
          failures: 50n,
        }),
      },
    ]);
    await after.tick();
    expect(await phase()).toBe('ROLLED_BACK');
  });

  it.each<[string, MessageInitShape<typeof AutoRolloutAnalysisSchema>, string]>([
    ['a last step below 100', { steps: [10, 50] }, 'the last step is 50; it must be 100'],
    ['steps that do not increase', { steps: [50, 10, 100] }, 'steps must increase: steps[1] is 10 after 50'],
    ['a step of 0', { steps: [0, 100] }, 'steps[0] is 0'],
    ['no interval', { intervalMs: 0n }, 'interval_ms is 0'],
    ['no requests', { minRequests: 0n }, 'min_requests is 0'],
    ['a p99 ratio below 1', { maxP99Ratio: 0.5 }, 'max_p99_ratio is 0.5'],
    ['a burn rate without an objective', { maxBurnRate: 2 }, 'objective is 0'],
  ])('refuses an analysis with %s', async (_name, analysis, message) => {
    const error = await rpcRejection(start(analysis));
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toContain(message);
    expect((await model()).autoRollout).toBeUndefined();
  });

  it('refuses a second rollout while one is in progress, replaces a paused one, and refuses a version the model lacks', async () => {
    expect(
      await rpcRejection(
        sut.start(
          create(StartAutoRolloutRequestSchema, {
            model: 'models/tiny',
            version: '9',
            analysis: { steps: [100], intervalMs: 1n, minRequests: 1n },
          }),
        ),
      ),
    ).toMatchObject({
      code: status.NOT_FOUND,
      reason: 'VERSION_NOT_FOUND',
    });
    await start();
    expect(await rpcRejection(start())).toMatchObject({
      code: status.FAILED_PRECONDITION,
      reason: 'ROLLOUT_IN_PROGRESS',
    });
    // A paused one is replaced, and ends aborted.
    await catalog.updateRollout('models/tiny', { case: 'rollback', value: true });
    expect(await phase()).toBe('PAUSED');
    await start();
    expect(await decisions()).toEqual(['STARTED 10', 'PAUSED 0', 'ABORTED 0', 'STARTED 10']);
    expect((await model()).rolloutHistory.at(-2)?.reason).toBe('replaced by an automatic rollout of version 2');
  });

  it('refuses to resume what is not paused, and a paused rollout whose canary was replaced', async () => {
    const resume = () => sut.start(create(StartAutoRolloutRequestSchema, { model: 'models/tiny', resume: true }));
    expect(await rpcRejection(resume())).toMatchObject({
      code: status.FAILED_PRECONDITION,
      reason: 'NO_PAUSED_ROLLOUT',
    });
    await start();
    await catalog.updateRollout('models/tiny', { case: 'rollback', value: true });
    expect(await rpcRejection(resume())).toMatchObject({ code: status.FAILED_PRECONDITION, reason: 'CANARY_REPLACED' });
  });
});
