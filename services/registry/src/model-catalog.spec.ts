import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  CreateModelVersionRequestSchema,
  type Model,
  ModelSchema,
  RolloutPolicySchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ManualClock, rpcRejection } from '@infermesh/testing';
import { ModelCatalog } from './model-catalog';
import { type TestCatalog, openTestCatalog } from './model-catalog.testing';
import type { EmbeddedModelStore } from './model-store.embedded';
import { LEFT_SERVING_SET_REASON, RETIRING_REASON, UNLOADED_REASON } from './version-lifecycle';

const GRACE_MS = 10_000;

describe(ModelCatalog.name, () => {
  let clock: ManualClock;
  let store: EmbeddedModelStore;
  let sut: ModelCatalog;
  let sha256: string;
  let opened: TestCatalog;

  beforeEach(async () => {
    clock = new ManualClock();
    opened = await openTestCatalog(clock, { REGISTRY_DRAIN_GRACE_MS: String(GRACE_MS) });
    ({ catalog: sut, store, sha256 } = opened);
  });
  afterEach(() => opened.close());

  const register = (versionId: string, model = 'mlp') =>
    sut.createVersion(
      create(CreateModelVersionRequestSchema, { parent: `models/${model}`, versionId, artifactSha256: sha256 }),
    );
  const report = (versionId: string, state: VersionState, reason = '', model = 'mlp') =>
    sut.reportState(`models/${model}/versions/${versionId}`, state, reason, 'worker-1');
  const ready = (versionId: string, model = 'mlp') => report(versionId, VersionState.READY, '', model);
  const states = async (model = 'mlp') =>
    Object.fromEntries(
      (await sut.getModel(`models/${model}`)).versions.map((v) => [
        v.name.slice(v.name.lastIndexOf('/') + 1),
        VersionState[v.state],
      ]),
    );
  const update = (init: MessageInitShape<typeof ModelSchema>, paths: string[]) =>
    sut.updateModel(create(ModelSchema, { name: 'models/mlp', ...init }), paths);
  const setRollout = (policy: MessageInitShape<typeof RolloutPolicySchema>) =>
    sut.setRollout('models/mlp', create(RolloutPolicySchema, policy));

  describe('version lifecycle', () => {
    it('loads a new version while the old one serves, drains the old one once the new one is READY, and retires it after the grace period', async () => {
      await register('1');
      await ready('1');
      expect((await register('2')).state).toBe(VersionState.REGISTERED);
      await report('2', VersionState.LOADING);
      expect(await states()).toEqual({ '1': 'READY', '2': 'LOADING' });
      expect((await sut.resolve('models/mlp', '')).name).toBe('models/mlp/versions/1');

      await ready('2');
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });
      expect((await sut.getModel('models/mlp')).versions[0]!.stateReason).toBe(LEFT_SERVING_SET_REASON);
      expect((await sut.resolve('models/mlp', '')).name).toBe('models/mlp/versions/2');

      clock.advance(GRACE_MS - 1);
      expect(await sut.sweep()).toBe(0);
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });
      clock.advance(1);
      expect(await sut.sweep()).toBe(1);
      expect(await states()).toEqual({ '1': 'RETIRED', '2': 'READY' });
    });

    it('keeps a version READY while another worker serves it: a second worker loading it, or failing to, does not take it away', async () => {
      const from = (worker: string, state: VersionState, reason = '') =>
        sut.reportState('models/mlp/versions/1', state, reason, worker);
      await register('1');
      await from('worker-a', VersionState.LOADING);
      await from('worker-a', VersionState.READY);

      await from('worker-b', VersionState.LOADING);
      expect(await states()).toEqual({ '1': 'READY' });
      await from('worker-b', VersionState.FAILED, 'no room in its memory budget');
      expect(await states()).toEqual({ '1': 'READY' });
      await from('worker-b', VersionState.READY);
      expect((await sut.getModel('models/mlp')).versions[0]!.readyWorkerIds).toEqual(['worker-a', 'worker-b']);

      // Only once no worker has it READY does a failure show.
      await from('worker-a', VersionState.FAILED, 'worker lost its GPU');
      expect(await states()).toEqual({ '1': 'READY' });
      await from('worker-b', VersionState.FAILED, 'worker lost its GPU');
      expect(await states()).toEqual({ '1': 'FAILED' });
      expect((await sut.getModel('models/mlp')).versions[0]!.readyWorkerIds).toEqual([]);
    });

    it('retires at once a version registered below the latest READY one', async () => {
      await register('2');
      await ready('2');
      expect((await register('1')).state).toBe(VersionState.RETIRED);
    });

    it('keeps the old version serving when the new one fails to load, and hands back to it when the new one fails while the old one drains', async () => {
      await register('1');
      await ready('1');
      await register('2');
      await report('2', VersionState.FAILED, 'out of memory');
      expect(await states()).toEqual({ '1': 'READY', '2': 'FAILED' });

      await register('3');
      await ready('3');
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'FAILED', '3': 'READY' });
      await report('3', VersionState.FAILED, 'worker lost its GPU');
      expect(await states()).toEqual({ '1': 'READY', '2': 'FAILED', '3': 'FAILED' });
    });

    it('does not let a late LOADING or READY report bring back a version outside the serving set; records FAILED unless RETIRED', async () => {
      await register('1');
      await ready('1');
      await register('2');
      await ready('2');

      const late = await ready('1');
      expect([VersionState[late.state], late.stateReason]).toEqual(['DRAINING', LEFT_SERVING_SET_REASON]);
      expect(VersionState[(await report('1', VersionState.LOADING)).state]).toBe('DRAINING');
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });

      clock.advance(GRACE_MS);
      await sut.sweep();
      expect(VersionState[(await ready('1')).state]).toBe('RETIRED');
      expect((await report('1', VersionState.FAILED, 'crashed')).state).toBe(VersionState.RETIRED);

      await register('3');
      await ready('3');
      const failed = await report('2', VersionState.FAILED, 'crashed while draining');
      expect([VersionState[failed.state], failed.stateReason]).toEqual(['FAILED', 'crashed while draining']);
    });

    it('keeps the versions the rollout policy names, brings back one still draining, and drains them once it no longer names them', async () => {
      await register('1');
      await ready('1');
      // Naming the stable version before the new one is READY keeps it serving throughout.
      await setRollout({ stableVersion: '1' });
      await register('2');
      await ready('2');
      expect(await states()).toEqual({ '1': 'READY', '2': 'READY' });
      await setRollout({ stableVersion: '1', canary: { version: '2', percent: 10 } });

      await sut.updateRollout('models/mlp', { case: 'promote', value: '' });
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });
      await setRollout({ stableVersion: '1', canary: { version: '2', percent: 10 } });
      expect(await states()).toEqual({ '1': 'READY', '2': 'READY' });

      // Without a stable version, the latest READY one is stable: the older one drains, and rolling
      // back while it drains pins it as stable again.
      await setRollout({ canary: { version: '2', percent: 10 } });
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });
      expect((await sut.updateRollout('models/mlp', { case: 'rollback', value: true })).rollout?.stableVersion).toBe(
        '1',
      );
      expect(await states()).toEqual({ '1': 'READY', '2': 'READY' });
    });

    it('serves what latest N, specific and all select', async () => {
      for (const id of ['1', '2', '3']) {
        await register(id);
        await ready(id);
      }
      await update({ versionPolicy: { policy: { case: 'all', value: {} } } }, ['version_policy']);
      expect(await states()).toEqual({ '1': 'READY', '2': 'READY', '3': 'READY' });
      await update({ versionPolicy: { policy: { case: 'specific', value: { versions: ['1', '3'] } } } }, [
        'version_policy',
      ]);
      expect(await states()).toEqual({ '1': 'READY', '2': 'DRAINING', '3': 'READY' });
      await update({ versionPolicy: { policy: { case: 'latest', value: 2 } } }, ['version_policy']);
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY', '3': 'READY' });
      // Clearing the policy is latest 1.
      const cleared = await update({}, ['version_policy']);
      expect(cleared.versionPolicy).toBeUndefined();
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'DRAINING', '3': 'READY' });
    });
  });

  describe(ModelCatalog.prototype.updateModel.name, () => {
    it('changes only the fields the mask names, stamps the new revision and keeps everything else', async () => {
      await register('1');
      await setRollout({ stableVersion: '1' });
      const changed = await update({ labels: { team: 'vision' }, pinned: true, unloaded: true }, ['labels', 'pinned']);
      expect([changed.labels, changed.pinned, changed.unloaded, changed.rollout?.stableVersion]).toEqual([
        { team: 'vision' },
        true,
        false,
        '1',
      ]);
      expect(changed.revision).toBe(BigInt(await store.revision()));
      const replaced = await update({ labels: { owner: 'ml' } }, ['labels']);
      expect([replaced.labels, replaced.pinned]).toEqual([{ owner: 'ml' }, true]);
      expect(replaced.revision).toBe(changed.revision + 1n);
    });

    it('refuses a bad mask or value with INVALID_ARGUMENT and an unknown model with NOT_FOUND, changing nothing', async () => {
      await register('1');
      const before = await sut.getModel('models/mlp');
      const cases: [() => Promise<unknown>, string][] = [
        [() => update({ labels: { a: 'b' } }, []), 'update_mask names no field'],
        [
          () => update({ rollout: {} }, ['labels', 'rollout']),
          'update_mask: "rollout" cannot be changed with UpdateModel',
        ],
        [() => update({ labels: { Bad: 'x' } }, ['labels']), 'labels: key "Bad" must be'],
        [
          () =>
            update({ versionPolicy: { policy: { case: 'specific', value: { versions: ['4'] } } } }, ['version_policy']),
          'version_policy: model "mlp" has no version 4',
        ],
        [() => sut.updateModel(undefined, ['pinned']), 'model.name must be "models/{model}", got ""'],
      ];
      for (const [call, message] of cases) {
        const error = await rpcRejection(call());
        expect([error.code, error.message]).toEqual([status.INVALID_ARGUMENT, expect.stringContaining(message)]);
      }
      const missing = await rpcRejection(
        sut.updateModel(create(ModelSchema, { name: 'models/none', pinned: true }), ['pinned']),
      );
      expect([missing.code, missing.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
      expect(await sut.getModel('models/mlp')).toEqual(before);
    });

    it('unloads a model: its versions drain, requests are refused saying it is unloaded, late reports are ignored, and it loads again', async () => {
      await register('1');
      await ready('1');
      await update({ unloaded: true }, ['unloaded']);
      expect(await states()).toEqual({ '1': 'DRAINING' });
      expect((await sut.getModel('models/mlp')).versions[0]!.stateReason).toBe(UNLOADED_REASON);
      const refused = await rpcRejection(sut.resolve('models/mlp', ''));
      expect([refused.code, refused.reason, refused.message]).toEqual([
        status.UNAVAILABLE,
        'MODEL_NOT_READY',
        'model "mlp" is unloaded; load it again with `infermesh models load mlp` or POST /v2/repository/models/mlp/load',
      ]);
      clock.advance(GRACE_MS);
      await sut.sweep();
      expect(await states()).toEqual({ '1': 'REGISTERED' });
      expect((await ready('1')).state).toBe(VersionState.REGISTERED);

      await update({ unloaded: false }, ['unloaded']);
      await ready('1');
      expect(await states()).toEqual({ '1': 'READY' });
      expect((await sut.resolve('models/mlp', '')).name).toBe('models/mlp/versions/1');
    });

    it('loads an unloaded model again within the grace period: the version still draining serves again', async () => {
      await register('1');
      await ready('1');
      await update({ unloaded: true }, ['unloaded']);
      clock.advance(GRACE_MS - 1);
      await update({ unloaded: false }, ['unloaded']);
      expect(await states()).toEqual({ '1': 'READY' });
    });
  });

  describe(ModelCatalog.prototype.retireVersion.name, () => {
    it('refuses a version that takes traffic, saying why', async () => {
      await register('1');
      await ready('1');
      await register('2');
      await ready('2');
      const latest = await rpcRejection(sut.retireVersion('models/mlp/versions/2'));
      expect([latest.code, latest.reason, latest.message]).toEqual([
        status.FAILED_PRECONDITION,
        'VERSION_IN_USE',
        'version 2 of model mlp still serves traffic: it is the latest READY version under version policy latest 1; register a newer version or change the version policy first',
      ]);
      await setRollout({ stableVersion: '1' });
      const named = await rpcRejection(sut.retireVersion('models/mlp/versions/1'));
      expect([named.reason, named.message]).toEqual([
        'VERSION_IN_USE',
        'version 1 of model mlp still serves traffic: the rollout policy names it as the stable version; change the rollout first (SetRolloutPolicy or UpdateRollout)',
      ]);
      expect(await states()).toEqual({ '1': 'READY', '2': 'READY' });
    });

    it('drains a loaded version and retires it for good: no policy brings it back', async () => {
      await register('1');
      await ready('1');
      await register('2');
      await ready('2');
      clock.advance(GRACE_MS / 2);
      const retiring = await sut.retireVersion('models/mlp/versions/1');
      expect([VersionState[retiring.state], retiring.stateReason]).toEqual(['DRAINING', RETIRING_REASON]);

      await update({ versionPolicy: { policy: { case: 'all', value: {} } } }, ['version_policy']);
      expect(await states()).toEqual({ '1': 'DRAINING', '2': 'READY' });
      const named = await rpcRejection(setRollout({ stableVersion: '1' }));
      expect(named.message).toBe(
        'rollout: the stable version is version 1, which was retired (it is DRAINING) and will never serve again',
      );
      expect((await ready('1')).state).toBe(VersionState.DRAINING);

      // It keeps the time it started to drain.
      clock.advance(GRACE_MS / 2);
      await sut.sweep();
      expect(await states()).toEqual({ '1': 'RETIRED', '2': 'READY' });
      expect((await sut.retireVersion('models/mlp/versions/1')).state).toBe(VersionState.RETIRED);
    });

    it('retires at once a version that is not loaded, even one the policy selects, and survives an unload', async () => {
      await register('1');
      await ready('1');
      await register('2');
      expect((await sut.retireVersion('models/mlp/versions/2')).state).toBe(VersionState.RETIRED);
      expect(await states()).toEqual({ '1': 'READY', '2': 'RETIRED' });

      await register('3');
      await update({ versionPolicy: { policy: { case: 'all', value: {} } } }, ['version_policy']);
      await update({ unloaded: true }, ['unloaded']);
      const retiring = await sut.retireVersion('models/mlp/versions/1');
      expect([VersionState[retiring.state], retiring.stateReason]).toEqual(['DRAINING', RETIRING_REASON]);
      clock.advance(GRACE_MS);
      await sut.sweep();
      await update({ unloaded: false }, ['unloaded']);
      expect(await states()).toEqual({ '1': 'RETIRED', '2': 'RETIRED', '3': 'REGISTERED' });
    });

    it('answers NOT_FOUND for an unknown model or version', async () => {
      await register('1');
      expect((await rpcRejection(sut.retireVersion('models/mlp/versions/9'))).reason).toBe('VERSION_NOT_FOUND');
      expect((await rpcRejection(sut.retireVersion('models/none/versions/1'))).reason).toBe('MODEL_NOT_FOUND');
    });
  });

  describe(ModelCatalog.prototype.deleteModel.name, () => {
    it('refuses to delete a loaded model, saying how to unload it, then deletes it once drained and keeps its artifact', async () => {
      await register('1');
      await ready('1');
      const loaded = await rpcRejection(sut.deleteModel('models/mlp'));
      expect([loaded.code, loaded.reason, loaded.message]).toEqual([
        status.FAILED_PRECONDITION,
        'MODEL_IN_USE',
        'model "mlp" is still loaded (version 1 is READY); unload it first: `infermesh models unload mlp` or POST /v2/repository/models/mlp/unload, and wait for it to drain',
      ]);
      await update({ unloaded: true }, ['unloaded']);
      expect((await rpcRejection(sut.deleteModel('models/mlp'))).message).toMatch(
        /^model "mlp" is still loaded \(version 1 is DRAINING\)/,
      );

      // Past the grace period it is deletable, sweep or not.
      clock.advance(GRACE_MS);
      const before = await store.revision();
      await sut.deleteModel('models/mlp');
      expect(await store.revision()).toBe(before + 1);
      expect((await rpcRejection(sut.getModel('models/mlp'))).reason).toBe('MODEL_NOT_FOUND');
      expect((await rpcRejection(sut.deleteModel('models/mlp'))).reason).toBe('MODEL_NOT_FOUND');
      // The artifact stays: the same version registers again.
      expect((await register('1')).state).toBe(VersionState.REGISTERED);
    });

    it('refuses to delete the fallback model of another model', async () => {
      await register('1', 'small');
      await register('1');
      await setRollout({ fallbackModel: 'small' });
      const error = await rpcRejection(sut.deleteModel('models/small'));
      expect([error.code, error.reason, error.message]).toEqual([
        status.FAILED_PRECONDITION,
        'MODEL_IN_USE',
        'model "small" is the fallback model of model "mlp"; change its rollout policy first',
      ]);
      await setRollout({});
      await sut.deleteModel('models/small');
      expect((await sut.listModels()).map((m: Model) => m.name)).toEqual(['models/mlp']);
    });
  });
});
