import { create, type MessageInitShape } from '@bufbuild/protobuf';
import {
  ModelSchema,
  type RolloutPolicySchema,
  type SetRolloutPolicyRequest,
  type UpdateRolloutRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { keepStable, ROLLOUT_GROUP } from './rollout.command';
import { runCapturing } from './testing/cli-runner';
import { type FakeRegistry, type RunningFakeRegistry, startFakeRegistry } from './testing/fake-registry';

const API_KEY = 'admin-key-0123456789abcdef';

const versions = (...states: VersionState[]) => states.map((state, i) => ({ name: `models/mlp/versions/${i + 1}`, state }));

describe(`infermesh ${ROLLOUT_GROUP.name}`, () => {
  let running: RunningFakeRegistry;
  let registry: FakeRegistry;

  beforeEach(async () => {
    running = await startFakeRegistry(API_KEY);
    registry = running.registry;
  });

  afterEach(async () => {
    await running.stop();
  });

  const sut = (...argv: string[]) => runCapturing(['rollout', ...argv], { INFERMESH_GATEWAY: running.address, INFERMESH_API_KEY: API_KEY });
  const seed = (states: VersionState[], rollout?: MessageInitShape<typeof RolloutPolicySchema>) =>
    registry.seed({ name: 'models/mlp', versions: versions(...states), ...(rollout !== undefined && { rollout }) });
  const policiesSet = () => registry.requests<SetRolloutPolicyRequest>('setRolloutPolicy');

  describe('stable', () => {
    it('pins the stable version and keeps the rest of the policy', async () => {
      seed([VersionState.READY, VersionState.READY], { shadow: { version: '1', percent: 5 }, fallbackModel: 'tiny' });

      const run = await sut('stable', 'mlp', '--version', '2');

      expect(run.code).toBe(0);
      expect(policiesSet()).toMatchObject([{ model: 'models/mlp', policy: { stableVersion: '2', shadow: { version: '1', percent: 5 }, fallbackModel: 'tiny' } }]);
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

      expect(policiesSet()).toMatchObject([{ model: 'models/mlp', policy: { stableVersion: '2', canary: { version: '3', percent: 10 }, variants: [] } }]);
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
      expect(run.stderr).toMatch(/^infermesh: --percent must be a percent from 0 to 100, got "150"\n\nUsage: infermesh rollout canary <name> --version <id> --percent <p> \[flags\]/);
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
      expect(run.stdout).toBe('Rollout of mlp:\n  stable    1 (READY)\n  variants  2: 30% of routing keys (READY)\n            3: 20% of routing keys (READY)\n');
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

      expect(policiesSet()).toMatchObject([{ policy: { stableVersion: '1', shadow: { version: '2', percent: 5 } } }, { policy: { stableVersion: '1' } }]);
      expect(policiesSet()[1]?.policy?.shadow).toBeUndefined();
    });

    it('sets a fallback model, then removes it with --off', async () => {
      seed([VersionState.READY]);

      const set = await sut('fallback', 'mlp', '--model', 'tiny');
      await sut('fallback', 'mlp', '--off');

      expect(policiesSet()).toMatchObject([{ policy: { stableVersion: '', fallbackModel: 'tiny' } }, { policy: { fallbackModel: '' } }]);
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

      expect(registry.requests<UpdateRolloutRequest>('updateRollout')).toMatchObject([{ model: 'models/mlp', action: { case: 'rollback', value: true } }]);
      expect(JSON.parse(run.stdout)).toMatchObject({ name: 'models/mlp' });
    });

    it('refuses weights without a share', async () => {
      const run = await sut('weights', 'mlp');

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(/^infermesh: missing <id>=<p>\n\nUsage: infermesh rollout weights <name> <id>=<p>\.\.\. \[flags\]/);
    });
  });

  describe('show', () => {
    it("shows the model's rollout", async () => {
      seed([VersionState.READY, VersionState.LOADING], { stableVersion: '1', canary: { version: '2', percent: 25 } });

      const run = await sut('show', 'mlp');

      expect(run).toEqual({ code: 0, stderr: '', stdout: 'Rollout of mlp:\n  stable  1 (READY)\n  canary  2: 25% of requests (LOADING)\n' });
    });

    it("passes the gateway's refusal on with exit 1", async () => {
      const run = await sut('show', 'nope');

      expect(run).toEqual({ code: 1, stdout: '', stderr: 'infermesh: model "nope" not found (NOT_FOUND)\n' });
    });
  });
});

describe(keepStable.name, () => {
  const model = (...states: VersionState[]) => create(ModelSchema, { name: 'models/mlp', versions: versions(...states) });
  const policy = (init: MessageInitShape<typeof RolloutPolicySchema>) => create(ModelSchema, { rollout: init }).rollout!;

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
    const sut = policy({ canary: { version: '3', percent: 5 }, variants: [{ version: '2', percent: 5 }], shadow: { version: '4', percent: 1 } });

    keepStable(model(VersionState.READY, VersionState.READY, VersionState.READY, VersionState.READY), sut);

    expect(sut.stableVersion).toBe('1');
  });
});
