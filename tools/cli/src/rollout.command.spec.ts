import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import {
  AutoRolloutPhase,
  type AutoRolloutSchema,
  ModelSchema,
  RolloutDecision,
  type RolloutEventSchema,
  type RolloutPolicySchema,
  type SetRolloutPolicyRequest,
  type StartAutoRolloutRequest,
  type StepFiguresSchema,
  type UpdateRolloutRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { keepStable, ROLLOUT_GROUP } from './rollout.command';
import { runCapturing } from './testing/cli-runner';
import type { FakeRegistry } from '@infermesh/testing';
import { type FakeGateway, startFakeGateway } from './testing/fake-gateway';

const API_KEY = 'admin-key-0123456789abcdef';

const versions = (...states: VersionState[]) =>
  states.map((state, i) => ({ name: `models/mlp/versions/${i + 1}`, state }));

describe(`infermesh ${ROLLOUT_GROUP.name}`, () => {
  let running: FakeGateway;
  let registry: FakeRegistry;

  beforeEach(async () => {
    running = await startFakeGateway(API_KEY);
    registry = running.registry;
  });

  afterEach(async () => {
    await running.stop();
  });

  const sut = (...argv: string[]) =>
    runCapturing(['rollout', ...argv], { INFERMESH_GATEWAY: running.address, INFERMESH_API_KEY: API_KEY });
  const seed = (states: VersionState[], rollout?: MessageInitShape<typeof RolloutPolicySchema>) =>
    registry.put({ name: 'models/mlp', versions: versions(...states), ...(rollout !== undefined && { rollout }) });
  const policiesSet = () => registry.requests<SetRolloutPolicyRequest>('setRolloutPolicy');

  describe('stable', () => {
    it('pins the stable version and keeps the rest of the policy', async () => {
      seed([VersionState.READY, VersionState.READY], { shadow: { version: '1', percent: 5 }, fallbackModel: 'tiny' });

      const run = await sut('stable', 'mlp', '--version', '2');

      expect(run.code).toBe(0);
      expect(policiesSet()).toMatchObject([
        {
          model: 'models/mlp',
          policy: { stableVersion: '2', shadow: { version: '1', percent: 5 }, fallbackModel: 'tiny' },
        },
      ]);
    });

    it('refuses a malformed version with exit 2 and calls nothing', async () => {
      seed([VersionState.READY]);

      const run = await sut('stable', 'mlp', '--version', 'one');

      expect(run.code).toBe(2);
      expect(policiesSet()).toEqual([]);
    });
  });

  describe('canary', () => {
    it('pins the stable version to the latest READY one when none is set, so the rest of the traffic stays', async () => {
      seed([VersionState.READY, VersionState.READY, VersionState.LOADING]);

      const run = await sut('canary', 'mlp', '--version', '3', '--percent', '10');

      expect(policiesSet()).toMatchObject([
        { model: 'models/mlp', policy: { stableVersion: '2', canary: { version: '3', percent: 10 }, variants: [] } },
      ]);
      expect(run).toEqual({
        code: 0,
        stderr: '',
        stdout: 'Rollout of mlp:\n  stable  2 (READY)\n  canary  3: 10% of requests (LOADING)\n',
      });
    });

    it('keeps the stable version, the variants, the shadow and the fallback already set', async () => {
      seed([VersionState.READY, VersionState.READY, VersionState.READY, VersionState.READY], {
        stableVersion: '1',
        variants: [{ version: '2', percent: 20 }],
        shadow: { version: '3', percent: 5 },
        fallbackModel: 'tiny',
      });

      const run = await sut('canary', 'mlp', '--version', '4', '--percent', '12.5%');

      expect(run.code).toBe(0);
      expect(policiesSet()).toMatchObject([
        {
          policy: {
            stableVersion: '1',
            canary: { version: '4', percent: 12.5 },
            variants: [{ version: '2', percent: 20 }],
            shadow: { version: '3', percent: 5 },
            fallbackModel: 'tiny',
          },
        },
      ]);
    });

    it('pins the latest READY version that is not the canary when the canary version takes the traffic now', async () => {
      seed([VersionState.READY, VersionState.READY]);

      await sut('canary', 'mlp', '--version', '2', '--percent', '5');

      expect(policiesSet()).toMatchObject([{ policy: { stableVersion: '1', canary: { version: '2', percent: 5 } } }]);
    });

    it('takes the stable version given with --stable', async () => {
      seed([VersionState.READY, VersionState.READY, VersionState.REGISTERED]);

      await sut('canary', 'mlp', '--version', '3', '--percent', '5', '--stable', '1');

      expect(policiesSet()).toMatchObject([{ policy: { stableVersion: '1' } }]);
    });

    it('refuses a percent above 100 with exit 2 and calls nothing', async () => {
      seed([VersionState.READY]);

      const run = await sut('canary', 'mlp', '--version', '1', '--percent', '150');

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        /^infermesh: --percent must be a percent from 0 to 100, got "150"\n\nUsage: infermesh rollout canary <name> --version <id> --percent <p> \[flags\]/,
      );
      expect(registry.calls).toEqual([]);
    });
  });

  describe('ab', () => {
    it('replaces the variants and pins the stable version', async () => {
      seed([VersionState.READY, VersionState.READY, VersionState.READY], { variants: [{ version: '2', percent: 50 }] });

      const run = await sut('ab', 'mlp', '--variant', '2=30', '--variant', '3=20');

      expect(run.code).toBe(0);
      expect(policiesSet()).toMatchObject([
        {
          policy: {
            stableVersion: '1',
            variants: [
              { version: '2', percent: 30 },
              { version: '3', percent: 20 },
            ],
          },
        },
      ]);
      expect(run.stdout).toBe(
        'Rollout of mlp:\n  stable    1 (READY)\n  variants  2: 30% of routing keys (READY)\n            3: 20% of routing keys (READY)\n',
      );
    });

    it('refuses a version named twice', async () => {
      const run = await sut('ab', 'mlp', '--variant', '2=30', '--variant', '2=20');

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(/^infermesh: --variant names version 2 more than once\n/);
    });
  });

  describe('shadow and fallback', () => {
    it('sets a shadow, then removes it with --off', async () => {
      seed([VersionState.READY, VersionState.READY]);

      await sut('shadow', 'mlp', '--version', '2', '--percent', '5');
      await sut('shadow', 'mlp', '--off');

      expect(policiesSet()).toMatchObject([
        { policy: { stableVersion: '1', shadow: { version: '2', percent: 5 } } },
        { policy: { stableVersion: '1' } },
      ]);
      expect(policiesSet()[1]?.policy?.shadow).toBeUndefined();
    });

    it('sets a fallback model, then removes it with --off', async () => {
      seed([VersionState.READY]);

      const set = await sut('fallback', 'mlp', '--model', 'tiny');
      await sut('fallback', 'mlp', '--off');

      expect(policiesSet()).toMatchObject([
        { policy: { stableVersion: '', fallbackModel: 'tiny' } },
        { policy: { fallbackModel: '' } },
      ]);
      expect(set.stdout).toContain('  fallback  model tiny\n');
    });

    it.each([
      [['shadow', 'mlp', '--version', '2'], 'give --version <id> and --percent <p>, or --off'],
      [['shadow', 'mlp', '--off', '--percent', '3'], '--off takes neither --version nor --percent'],
      [['fallback', 'mlp'], 'give either --model <name> or --off'],
      [['fallback', 'mlp', '--model', 'tiny', '--off'], 'give either --model <name> or --off'],
    ])('refuses %j with exit 2', async (argv, message) => {
      const run = await sut(...argv);

      expect(run.code).toBe(2);
      expect(run.stderr.split('\n')[0]).toBe(`infermesh: ${message}`);
      expect(registry.calls).toEqual([]);
    });
  });

  describe('weights, promote and rollback', () => {
    beforeEach(() => {
      seed([VersionState.READY, VersionState.READY, VersionState.READY]);
    });

    it('sets new shares with UpdateRollout set_weights', async () => {
      const run = await sut('weights', 'mlp', '2=30', '3=10');

      expect(run.code).toBe(0);
      expect(registry.requests<UpdateRolloutRequest>('updateRollout')).toMatchObject([
        { model: 'models/mlp', action: { case: 'setWeights', value: { percents: { '2': 30, '3': 10 } } } },
      ]);
    });

    it('promotes the canary, or the version named', async () => {
      await sut('promote', 'mlp');
      await sut('promote', 'mlp', '--version', '3');

      expect(registry.requests<UpdateRolloutRequest>('updateRollout')).toMatchObject([
        { model: 'models/mlp', action: { case: 'promote', value: '' } },
        { model: 'models/mlp', action: { case: 'promote', value: '3' } },
      ]);
    });

    it('rolls back', async () => {
      const run = await sut('rollback', 'mlp', '--json');

      expect(registry.requests<UpdateRolloutRequest>('updateRollout')).toMatchObject([
        { model: 'models/mlp', action: { case: 'rollback', value: true } },
      ]);
      expect(JSON.parse(run.stdout)).toMatchObject({ name: 'models/mlp' });
    });

    it('refuses weights without a share', async () => {
      const run = await sut('weights', 'mlp');

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        /^infermesh: missing <id>=<p>\n\nUsage: infermesh rollout weights <name> <id>=<p>\.\.\. \[flags\]/,
      );
    });
  });

  describe('show', () => {
    it("shows the model's rollout", async () => {
      seed([VersionState.READY, VersionState.LOADING], { stableVersion: '1', canary: { version: '2', percent: 25 } });

      const run = await sut('show', 'mlp');

      expect(run).toEqual({
        code: 0,
        stderr: '',
        stdout: 'Rollout of mlp:\n  stable  1 (READY)\n  canary  2: 25% of requests (LOADING)\n',
      });
    });

    it("passes the gateway's refusal on with exit 1", async () => {
      const run = await sut('show', 'nope');

      expect(run).toEqual({ code: 1, stdout: '', stderr: 'infermesh: model "nope" not found (NOT_FOUND)\n' });
    });
  });

  describe('automatic rollouts', () => {
    const at = (iso: string) => timestampFromDate(new Date(iso));
    const started = () => registry.requests<StartAutoRolloutRequest>('startAutoRollout');
    /** Version 1 stable and READY, version 2 READY: the canary to be. */
    const seedTwo = () =>
      registry.put({
        name: 'models/mlp',
        versions: versions(VersionState.READY, VersionState.READY),
        rollout: { stableVersion: '1' },
      });
    /** The figures of a step in which the canary did worse than the stable version on p99. */
    const slowCanary: MessageInitShape<typeof StepFiguresSchema> = {
      canary: { version: '2', requests: 412n, errors: 1n, errorRate: 1 / 412, p99Ms: 68.4 },
      stable: { version: '1', requests: 7803n, errors: 15n, errorRate: 15 / 7803, p99Ms: 38 },
      gates: [
        { gate: 'error_rate_increase', checked: true, passed: true, value: 1 / 412 - 15 / 7803, threshold: 0.005 },
        { gate: 'p99_ratio', checked: true, passed: false, value: 1.8, threshold: 1.2 },
      ],
      elapsedMs: 9_500n,
    };

    describe('auto', () => {
      it('starts an automatic rollout with the default analysis and prints it', async () => {
        seedTwo();

        const run = await sut('auto', 'mlp', '--version', '2');

        expect(started()).toHaveLength(1);
        expect(started()[0]).toMatchObject({
          model: 'models/mlp',
          version: '2',
          resume: false,
          analysis: {
            steps: [5, 10, 25, 50, 100],
            intervalMs: 60_000n,
            minRequests: 200n,
            maxErrorRateIncrease: 0.005,
            maxP99Ratio: 1.2,
            minAgreement: 0.99,
            objective: 0,
          },
        });
        expect(started()[0]!.analysis!.maxBurnRate).toBeUndefined();
        expect(run.code).toBe(0);
        expect(run.stdout).toMatch(
          /^Rollout of mlp:\n  stable  1 \(READY\)\n  canary  2: 5% of requests \(READY\)\n\nAutomatic rollout of mlp version 2 against stable 1: PROGRESSING\n/,
        );
        expect(run.stdout).toMatch(
          /\n  step     1\/5 at 5%, for \d+\.\d s\n  reason   waiting for 200 canary requests\n/,
        );
        expect(run.stdout).toContain('\n  steps    5, 10, 25, 50, 100%, each at least 1m and 200 canary requests\n');
        expect(run.stdout).toContain(
          "\n  gates    error rate at most 0.005 above the stable's; p99 at most 1.2× the stable's; shadow agreement at least 0.99\n",
        );
      });

      it('sends the analysis its flags give', async () => {
        seedTwo();

        const flags = [
          '--steps',
          '10, 50%,100',
          '--interval',
          '30s',
          '--min-requests',
          '50',
          '--max-error-rate-increase',
          '0.01',
          '--max-p99-ratio',
          '1.5',
        ];
        const run = await sut(
          'auto',
          'mlp',
          '--version',
          '2',
          ...flags,
          '--min-agreement',
          '0.95',
          '--max-burn-rate',
          '2',
          '--objective',
          '99.9',
        );
        await sut('auto', 'mlp', '--version', '2', '--interval', '500ms', '--max-burn-rate', '1');

        expect(run.code).toBe(0);
        expect(started().map((r) => r.analysis)).toMatchObject([
          {
            steps: [10, 50, 100],
            intervalMs: 30_000n,
            minRequests: 50n,
            maxErrorRateIncrease: 0.01,
            maxP99Ratio: 1.5,
            minAgreement: 0.95,
            maxBurnRate: 2,
            objective: 99.9,
          },
          { intervalMs: 500n, maxBurnRate: 1, objective: 99.5 },
        ]);
      });

      it.each([
        [
          ['--version', '2', '--steps', '5,10,50'],
          'auto rollout: the last step is 50; it must be 100 (the canary then takes every request before it is promoted)',
        ],
        [['--version', '2', '--steps', '10,5,100'], 'auto rollout: steps must increase: steps[1] is 5 after 10'],
        [
          ['--version', '2', '--steps', '0,100'],
          'auto rollout: steps[0] is 0; each step is a percent above 0, at most 100',
        ],
        [
          ['--version', '2', '--interval', '60'],
          '--interval must be a duration with its unit, such as 30s, 1m or 500ms, got "60"',
        ],
        [
          ['--version', '2', '--interval', 'soon'],
          '--interval must be a duration with its unit, such as 30s, 1m or 500ms, got "soon"',
        ],
        [['--version', '2', '--min-requests', '0'], '--min-requests must be an integer of at least 1, got "0"'],
        [
          ['--version', '2', '--max-error-rate-increase', '2'],
          '--max-error-rate-increase must be a fraction from 0 to 1, such as 0.005, got "2"',
        ],
        [['--version', '2', '--max-p99-ratio', '0'], '--max-p99-ratio must be a number above 0, such as 1.2, got "0"'],
        [
          ['--version', '2', '--min-agreement', '1.1'],
          '--min-agreement must be a fraction from 0 to 1, such as 0.99, got "1.1"',
        ],
        [['--version', '2', '--max-burn-rate', 'x'], '--max-burn-rate must be a number above 0, such as 2, got "x"'],
        [
          ['--version', '2', '--max-burn-rate', '2', '--objective', '100'],
          'auto rollout: objective is 100; max_burn_rate needs the availability objective it burns, a percent above 0 and below 100',
        ],
        [
          ['--version', '2', '--objective', '99'],
          '--objective applies only with --max-burn-rate, the gate it is measured for',
        ],
        [['--version', 'two'], '--version must be a positive integer version id, got "two"'],
        [[], 'give --version <id> to start an automatic rollout, or --resume to resume a paused one'],
        [
          ['--resume', '--version', '2'],
          '--resume takes no --version: the paused rollout goes on with its own version and analysis',
        ],
        [
          ['--resume', '--interval', '1m'],
          '--resume takes no --interval: the paused rollout goes on with its own version and analysis',
        ],
      ])('refuses %j with exit 2 naming the flag, and calls nothing', async (argv, message) => {
        const run = await sut('auto', 'mlp', ...argv);

        expect(run.code).toBe(2);
        expect(run.stderr).toMatch(/\n\nUsage: infermesh rollout auto <name> \[flags\]\n/);
        expect(run.stderr.split('\n')[0]).toBe(`infermesh: ${message}`);
        expect(registry.calls).toEqual([]);
      });

      it('resumes a paused rollout with --resume', async () => {
        seedTwo();
        await sut('auto', 'mlp', '--version', '2');
        await sut('pause', 'mlp');

        const run = await sut('auto', 'mlp', '--resume');

        expect(started()[1]).toMatchObject({ model: 'models/mlp', version: '', resume: true });
        expect(started()[1]!.analysis).toBeUndefined();
        expect(run.code).toBe(0);
        expect(run.stdout).toContain('Automatic rollout of mlp version 2 against stable 1: PROGRESSING\n');
      });

      it("passes the registry's refusal on with exit 1", async () => {
        registry.put({ name: 'models/mlp', versions: versions(VersionState.READY, VersionState.LOADING) });

        const run = await sut('auto', 'mlp', '--version', '2');

        expect(run).toEqual({
          code: 1,
          stdout: '',
          stderr: 'infermesh: version 2 of model "mlp" is not READY (FAILED_PRECONDITION)\n',
        });
      });

      describe('--wait', () => {
        it('prints a line per decision and exits 0 once the canary is promoted', async () => {
          seedTwo();
          registry.beforeGetModel = (r) => {
            r.beforeGetModel = undefined;
            r.decide('models/mlp', RolloutDecision.ADVANCED, {
              reason: 'step 1 passed',
              atMs: Date.parse('2025-03-01T10:01:00Z'),
              figures: { ...slowCanary, gates: [] },
            });
            r.decide('models/mlp', RolloutDecision.PROMOTED, {
              reason: 'every step passed',
              atMs: Date.parse('2025-03-01T10:02:00Z'),
            });
          };

          const run = await sut('auto', 'mlp', '--version', '2', '--steps', '50,100', '--wait');

          expect(run.code).toBe(0);
          const lines = run.stderr.trimEnd().split('\n');
          expect(lines).toHaveLength(3);
          expect(lines[0]).toMatch(/^\S+Z  STARTED  version 2, step 1\/2 at 50%: waiting for 200 canary requests$/);
          expect(lines.slice(1)).toEqual([
            '2025-03-01T10:01:00.000Z  ADVANCED  version 2, step 2/2 at 100%: step 1 passed; canary 412 req, 0.243% errors, p99 68.4 ms; stable 7803 req, 0.192% errors, p99 38 ms',
            '2025-03-01T10:02:00.000Z  PROMOTED  version 2, step 2/2 at 100%: every step passed',
          ]);
          expect(run.stdout).toMatch(
            /^Rollout of mlp:\n  stable  2 \(READY\)\n\nAutomatic rollout of mlp version 2 against stable 1: PROMOTED\n/,
          );
        });

        it.each([
          [
            'ROLLED_BACK',
            RolloutDecision.ROLLED_BACK,
            'p99_ratio 1.8 is above 1.2',
            'infermesh: mlp version 2 was rolled back: p99_ratio 1.8 is above 1.2',
          ],
          [
            'ABORTED',
            RolloutDecision.ABORTED,
            'version 1 left the serving versions',
            'infermesh: the automatic rollout of mlp version 2 was aborted: version 1 left the serving versions',
          ],
        ])('exits 1 when the registry decides %s, saying why', async (name, decision, reason, message) => {
          seedTwo();
          registry.beforeGetModel = (r) => {
            r.beforeGetModel = undefined;
            r.decide('models/mlp', decision, { reason, figures: slowCanary });
          };

          const run = await sut('auto', 'mlp', '--version', '2', '--wait');

          expect(run.code).toBe(1);
          const lines = run.stderr.trimEnd().split('\n');
          expect(lines.slice(1)).toEqual([
            expect.stringMatching(new RegExp(`^\\S+Z  ${name}  version 2, step 1/5 at 5%: ${reason}; canary 412 req`)),
            message,
          ]);
          expect(run.stdout).toContain(`Automatic rollout of mlp version 2 against stable 1: ${name}\n`);
        });

        it('prints only the final model with --json, and no progress', async () => {
          seedTwo();
          registry.beforeGetModel = (r) => {
            r.beforeGetModel = undefined;
            r.decide('models/mlp', RolloutDecision.ROLLED_BACK, {
              reason: 'p99_ratio 1.8 is above 1.2',
              figures: slowCanary,
            });
          };

          const run = await sut('auto', 'mlp', '--version', '2', '--wait', '--json');

          expect(run.code).toBe(1);
          expect(run.stderr).toBe('infermesh: mlp version 2 was rolled back: p99_ratio 1.8 is above 1.2\n');
          expect(JSON.parse(run.stdout)).toMatchObject({
            name: 'models/mlp',
            autoRollout: {
              canaryVersion: '2',
              phase: 'AUTO_ROLLOUT_PHASE_ROLLED_BACK',
              reason: 'p99_ratio 1.8 is above 1.2',
            },
            rolloutHistory: [{ decision: 'ROLLOUT_DECISION_STARTED' }, { decision: 'ROLLOUT_DECISION_ROLLED_BACK' }],
          });
        });
      });
    });

    describe('pause', () => {
      it('pauses the automatic rollout with UpdateRollout pause', async () => {
        seedTwo();
        await sut('auto', 'mlp', '--version', '2');

        const run = await sut('pause', 'mlp');

        expect(registry.requests<UpdateRolloutRequest>('updateRollout')).toMatchObject([
          { model: 'models/mlp', action: { case: 'pause', value: true } },
        ]);
        expect(run.code).toBe(0);
        expect(run.stdout).toContain('Automatic rollout of mlp version 2 against stable 1: PAUSED\n');
        expect(run.stdout).toContain('\n  reason   paused by UpdateRollout\n');
      });

      it("passes the registry's refusal on with exit 1 when nothing is in progress", async () => {
        seedTwo();

        const run = await sut('pause', 'mlp');

        expect(run).toEqual({
          code: 1,
          stdout: '',
          stderr: 'infermesh: model "mlp" has no automatic rollout in progress (FAILED_PRECONDITION)\n',
        });
      });
    });

    describe('show and history', () => {
      const ANALYSIS = {
        steps: [5, 10, 25, 50, 100],
        intervalMs: 60_000n,
        minRequests: 200n,
        maxErrorRateIncrease: 0.005,
        maxP99Ratio: 1.2,
        minAgreement: 0.99,
      };
      const rolledBack: MessageInitShape<typeof AutoRolloutSchema> = {
        id: 'r1',
        canaryVersion: '2',
        stableVersion: '1',
        analysis: ANALYSIS,
        phase: AutoRolloutPhase.ROLLED_BACK,
        step: 1,
        startTime: at('2025-03-01T10:00:00Z'),
        stepStartTime: at('2025-03-01T10:01:05Z'),
        updateTime: at('2025-03-01T10:01:14.500Z'),
        reason: 'p99_ratio 1.8 is above 1.2',
        figures: {
          ...slowCanary,
          gates: [
            ...slowCanary.gates!,
            { gate: 'agreement', checked: false, threshold: 0.99, note: 'no shadow comparisons in the step' },
          ],
        },
      };
      const HISTORY: MessageInitShape<typeof RolloutEventSchema>[] = [
        {
          time: at('2025-03-01T10:00:00Z'),
          rolloutId: 'r1',
          version: '2',
          decision: RolloutDecision.STARTED,
          step: 0,
          percent: 5,
          reason: 'started by StartAutoRollout',
        },
        {
          time: at('2025-03-01T10:01:05Z'),
          rolloutId: 'r1',
          version: '2',
          decision: RolloutDecision.ADVANCED,
          step: 1,
          percent: 10,
          reason: 'every gate holds',
          figures: {
            canary: { version: '2', requests: 230n, errorRate: 0, p99Ms: 40.1, shadowItems: 64n, agreement: 0.996 },
            stable: { version: '1', requests: 4350n, errors: 9n, errorRate: 9 / 4350, p99Ms: 37.5 },
          },
        },
        {
          time: at('2025-03-01T10:01:14.500Z'),
          rolloutId: 'r1',
          version: '2',
          decision: RolloutDecision.ROLLED_BACK,
          step: 1,
          percent: 0,
          reason: 'p99_ratio 1.8 is above 1.2',
          figures: slowCanary,
        },
      ];

      it('shows the automatic rollout: phase, versions, step, time in step, reason, figures and each gate', async () => {
        registry.put({
          name: 'models/mlp',
          versions: versions(VersionState.READY, VersionState.READY),
          rollout: { stableVersion: '1' },
          autoRollout: rolledBack,
        });

        const run = await sut('show', 'mlp');

        expect(run).toEqual({
          code: 0,
          stderr: '',
          stdout: [
            'Rollout of mlp:',
            '  stable  1 (READY)',
            '',
            'Automatic rollout of mlp version 2 against stable 1: ROLLED_BACK',
            '  step     2/5 at 10%, for 9.5 s',
            '  reason   p99_ratio 1.8 is above 1.2',
            '  steps    5, 10, 25, 50, 100%, each at least 1m and 200 canary requests',
            "  gates    error rate at most 0.005 above the stable's; p99 at most 1.2× the stable's; shadow agreement at least 0.99",
            '  started  2025-03-01T10:00:00.000Z',
            '  figures over 9.5 s of the step:',
            '    VERSION     REQUESTS  ERRORS  ERROR RATE  P99      AGREEMENT',
            '    2 (canary)  412       1       0.243%      68.4 ms  -',
            '    1 (stable)  7803      15      0.192%      38 ms    -',
            '  gates:',
            '    GATE                 VALUE      THRESHOLD  RESULT',
            '    error_rate_increase  0.0005048  max 0.005  passed',
            '    p99_ratio            1.8        max 1.2    FAILED',
            '    agreement            -          min 0.99   not checked: no shadow comparisons in the step',
            '',
          ].join('\n'),
        });
      });

      it('lists the decisions oldest first with their figures, and the whole model with --json', async () => {
        registry.put({
          name: 'models/mlp',
          versions: versions(VersionState.READY, VersionState.READY),
          autoRollout: rolledBack,
          rolloutHistory: HISTORY,
        });

        const run = await sut('history', 'mlp');
        const json = await sut('history', 'mlp', '--json');

        expect(run).toEqual({
          code: 0,
          stderr: '',
          stdout: [
            'TIME                      DECISION     VERSION  STEP  PERCENT  CANARY                                            STABLE                                REASON',
            '2025-03-01T10:00:00.000Z  STARTED      2        1/5   5%       -                                                 -                                     started by StartAutoRollout',
            '2025-03-01T10:01:05.000Z  ADVANCED     2        2/5   10%      230 req, 0% errors, p99 40.1 ms, agreement 99.6%  4350 req, 0.207% errors, p99 37.5 ms  every gate holds',
            '2025-03-01T10:01:14.500Z  ROLLED_BACK  2        2/5   0%       412 req, 0.243% errors, p99 68.4 ms               7803 req, 0.192% errors, p99 38 ms    p99_ratio 1.8 is above 1.2',
            '',
          ].join('\n'),
        });
        expect(JSON.parse(json.stdout)).toMatchObject({
          rolloutHistory: [
            { decision: 'ROLLOUT_DECISION_STARTED' },
            { decision: 'ROLLOUT_DECISION_ADVANCED' },
            { decision: 'ROLLOUT_DECISION_ROLLED_BACK' },
          ],
        });
      });

      it('says so when the model never had an automatic rollout', async () => {
        seedTwo();

        const history = await sut('history', 'mlp');
        const show = await sut('show', 'mlp');

        expect(history.stdout).toBe(
          'No automatic rollout of mlp yet: start one with `infermesh rollout auto mlp --version <id>`.\n',
        );
        expect(show.stdout).toBe('Rollout of mlp:\n  stable  1 (READY)\n');
      });
    });
  });

  describe(keepStable.name, () => {
    const model = (...states: VersionState[]) =>
      create(ModelSchema, { name: 'models/mlp', versions: versions(...states) });
    const policy = (init: MessageInitShape<typeof RolloutPolicySchema>) =>
      create(ModelSchema, { rollout: init }).rollout!;

    it('leaves a stable version already set', () => {
      const sut = policy({ stableVersion: '1', canary: { version: '2', percent: 5 } });

      keepStable(model(VersionState.READY, VersionState.READY), sut);

      expect(sut.stableVersion).toBe('1');
    });

    it('leaves it unset when no other version is READY', () => {
      const sut = policy({ canary: { version: '2', percent: 5 } });

      keepStable(model(VersionState.LOADING, VersionState.READY), sut);

      expect(sut.stableVersion).toBe('');
    });

    it('pins the version still DRAINING when the canary has just replaced it', () => {
      const sut = policy({ canary: { version: '2', percent: 10 } });

      keepStable(model(VersionState.DRAINING, VersionState.READY), sut);

      expect(sut.stableVersion).toBe('1');
    });

    it('skips every version the policy names', () => {
      const sut = policy({
        canary: { version: '3', percent: 5 },
        variants: [{ version: '2', percent: 5 }],
        shadow: { version: '4', percent: 1 },
      });

      keepStable(model(VersionState.READY, VersionState.READY, VersionState.READY, VersionState.READY), sut);

      expect(sut.stableVersion).toBe('1');
    });
  });
});
