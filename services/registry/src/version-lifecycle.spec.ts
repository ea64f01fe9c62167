import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import { SeededRandom } from '@infermesh/model-builder';
import {
  type Model,
  ModelSchema,
  type RolloutPolicySchema,
  type VersionPolicySchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  applyLifecycle,
  describeVersionPolicy,
  LEFT_SERVING_SET_REASON,
  RETIRING_REASON,
  servingSet,
  UNLOADED_REASON,
  whyServing,
} from './version-lifecycle';

const { REGISTERED, LOADING, READY, DRAINING, RETIRED, FAILED } = VersionState;
const GRACE_MS = 10_000;
const T0 = new Date('2030-01-01T00:00:00Z');
const at = (ms: number) => new Date(T0.getTime() + ms);

interface ModelInit {
  /** Version id → state, or [state, state_reason]. */
  versions: Record<string, VersionState | [VersionState, string]>;
  policy?: MessageInitShape<typeof VersionPolicySchema>;
  rollout?: MessageInitShape<typeof RolloutPolicySchema>;
  unloaded?: boolean;
}

/** A model whose versions all last changed at T0. */
function model(init: ModelInit): Model {
  return create(ModelSchema, {
    name: 'models/mlp',
    versions: Object.entries(init.versions)
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([id, state]) => ({
        name: `models/mlp/versions/${id}`,
        state: Array.isArray(state) ? state[0] : state,
        stateReason: Array.isArray(state) ? state[1] : '',
        updateTime: timestampFromDate(T0),
      })),
    ...(init.policy !== undefined && { versionPolicy: init.policy }),
    ...(init.rollout !== undefined && { rollout: init.rollout }),
    unloaded: init.unloaded ?? false,
  });
}

const states = (m: Model) =>
  Object.fromEntries(m.versions.map((v) => [v.name.slice(v.name.lastIndexOf('/') + 1), VersionState[v.state]]));
const serving = (m: Model) => [...servingSet(m)].sort((a, b) => Number(a) - Number(b));
const after = (m: Model, ms = 0) => applyLifecycle(m, at(ms), GRACE_MS).model;

describe(servingSet.name, () => {
  it('serves the latest version by default: a newer one loads while the old one serves, and replaces it once READY', () => {
    expect(serving(model({ versions: { '1': READY, '2': REGISTERED } }))).toEqual(['1', '2']);
    expect(serving(model({ versions: { '1': READY, '2': LOADING } }))).toEqual(['1', '2']);
    expect(serving(model({ versions: { '1': READY, '2': READY } }))).toEqual(['2']);
    expect(serving(model({ versions: { '1': REGISTERED, '2': REGISTERED } }))).toEqual(['1', '2']);
    // A version registered below the latest READY one never loads.
    expect(serving(model({ versions: { '1': REGISTERED, '2': READY } }))).toEqual(['2']);
  });

  it('keeps the old version when the newer one fails, and counts still-draining versions as loaded', () => {
    expect(serving(model({ versions: { '1': READY, '2': FAILED } }))).toEqual(['1']);
    expect(serving(model({ versions: { '1': DRAINING, '2': FAILED } }))).toEqual(['1']);
    expect(serving(model({ versions: { '1': DRAINING, '2': READY } }))).toEqual(['2']);
  });

  it('serves the N latest with latest N, the named ones with specific, and every one with all', () => {
    const versions = { '1': READY, '2': READY, '3': READY, '4': REGISTERED } as const;
    expect(serving(model({ versions, policy: { policy: { case: 'latest', value: 2 } } }))).toEqual(['2', '3', '4']);
    expect(
      serving(model({ versions, policy: { policy: { case: 'specific', value: { versions: ['1', '3'] } } } })),
    ).toEqual(['1', '3']);
    expect(serving(model({ versions, policy: { policy: { case: 'all', value: {} } } }))).toEqual(['1', '2', '3', '4']);
  });

  it('adds the versions the rollout policy names, whatever the version policy selects', () => {
    const rollout = {
      stableVersion: '1',
      canary: { version: '2', percent: 10 },
      variants: [{ version: '3', percent: 5 }],
      shadow: { version: '4', percent: 1 },
    };
    expect(
      serving(model({ versions: { '1': READY, '2': READY, '3': DRAINING, '4': REGISTERED, '5': READY }, rollout })),
    ).toEqual(['1', '2', '3', '4', '5']);
  });

  it('never serves a RETIRED or retiring version, even when a policy names it', () => {
    const m = model({
      versions: { '1': RETIRED, '2': [DRAINING, RETIRING_REASON], '3': READY },
      policy: { policy: { case: 'all', value: {} } },
      rollout: { stableVersion: '1', canary: { version: '2', percent: 5 } },
    });
    expect(serving(m)).toEqual(['3']);
    expect(
      serving(
        model({
          versions: { '1': RETIRED, '2': READY },
          policy: { policy: { case: 'specific', value: { versions: ['1'] } } },
        }),
      ),
    ).toEqual([]);
  });

  it('serves nothing of an unloaded model, not even what the rollout names', () => {
    expect(
      serving(model({ versions: { '1': READY, '2': REGISTERED }, rollout: { stableVersion: '1' }, unloaded: true })),
    ).toEqual([]);
  });
});

describe(applyLifecycle.name, () => {
  it('drains a READY version that leaves the set, and retires it once it has drained for the grace period', () => {
    const drained = applyLifecycle(model({ versions: { '1': READY, '2': READY } }), at(0), GRACE_MS);
    expect(states(drained.model)).toEqual({ '1': 'DRAINING', '2': 'READY' });
    expect(drained.model.versions[0]!.stateReason).toBe(LEFT_SERVING_SET_REASON);
    expect(drained.transitions).toEqual([
      { version: 'models/mlp/versions/1', from: READY, to: DRAINING, reason: LEFT_SERVING_SET_REASON },
    ]);

    expect(states(after(drained.model, GRACE_MS - 1))).toEqual({ '1': 'DRAINING', '2': 'READY' });
    const retired = after(drained.model, GRACE_MS);
    expect(states(retired)).toEqual({ '1': 'RETIRED', '2': 'READY' });
    expect(retired.versions[0]!.stateReason).toBe('');
    expect(retired.versions[0]!.updateTime).toEqual(timestampFromDate(at(GRACE_MS)));
  });

  it('retires at once the versions outside the set that take no traffic: REGISTERED and LOADING', () => {
    expect(states(after(model({ versions: { '1': REGISTERED, '2': LOADING, '3': READY } })))).toEqual({
      '1': 'RETIRED',
      '2': 'RETIRED',
      '3': 'READY',
    });
  });

  it('leaves FAILED and RETIRED versions as they are', () => {
    const m = model({ versions: { '1': RETIRED, '2': [FAILED, 'out of memory'], '3': READY } });
    expect(applyLifecycle(m, at(GRACE_MS * 10), GRACE_MS).transitions).toEqual([]);
  });

  it('brings back a version that is still draining once a policy selects it again', () => {
    const rolledBack = after(
      model({ versions: { '1': [DRAINING, LEFT_SERVING_SET_REASON], '2': READY }, rollout: { stableVersion: '1' } }),
    );
    expect(states(rolledBack)).toEqual({ '1': 'READY', '2': 'READY' });
    expect(rolledBack.versions[0]!.stateReason).toBe('');
    // The newer version failed while the old one drained: the old one serves again.
    expect(states(after(model({ versions: { '1': DRAINING, '2': FAILED } })))).toEqual({ '1': 'READY', '2': 'FAILED' });
  });

  it('never brings back a retiring version, and retires it after the grace period even on an unloaded model', () => {
    const retiring = model({
      versions: { '1': [DRAINING, RETIRING_REASON], '2': READY },
      policy: { policy: { case: 'all', value: {} } },
    });
    expect(states(after(retiring))).toEqual({ '1': 'DRAINING', '2': 'READY' });
    expect(states(after(retiring, GRACE_MS))).toEqual({ '1': 'RETIRED', '2': 'READY' });
    expect(states(after(model({ versions: { '1': [DRAINING, RETIRING_REASON] }, unloaded: true }), GRACE_MS))).toEqual({
      '1': 'RETIRED',
    });
  });

  it('unloads a model: loaded versions drain and become REGISTERED again, the others stay loadable', () => {
    const unloaded = applyLifecycle(
      model({ versions: { '1': REGISTERED, '2': LOADING, '3': READY }, unloaded: true }),
      at(0),
      GRACE_MS,
    ).model;
    expect(states(unloaded)).toEqual({ '1': 'REGISTERED', '2': 'REGISTERED', '3': 'DRAINING' });
    expect(unloaded.versions[2]!.stateReason).toBe(UNLOADED_REASON);
    const drained = after(unloaded, GRACE_MS);
    expect(states(drained)).toEqual({ '1': 'REGISTERED', '2': 'REGISTERED', '3': 'REGISTERED' });

    // Loaded again after the grace period: the versions load again and the old ones leave once the latest is READY.
    drained.unloaded = false;
    expect(states(after(drained, GRACE_MS))).toEqual({ '1': 'REGISTERED', '2': 'REGISTERED', '3': 'REGISTERED' });
    // Loaded again within the grace period: the version still draining serves again at once.
    unloaded.unloaded = false;
    expect(states(after(unloaded, 1))).toEqual({ '1': 'RETIRED', '2': 'RETIRED', '3': 'READY' });
  });

  it('does not change the model it is given', () => {
    const m = model({ versions: { '1': READY, '2': READY } });
    after(m);
    expect(states(m)).toEqual({ '1': 'READY', '2': 'READY' });
  });

  it('changes nothing when applied again at the same time, whatever the states and policies', () => {
    const random = new SeededRandom(42);
    const pick = <T>(list: readonly T[]): T => list[Math.floor(random.next() * list.length)]!;
    const allStates = [REGISTERED, LOADING, READY, DRAINING, RETIRED, FAILED];
    const policies: (MessageInitShape<typeof VersionPolicySchema> | undefined)[] = [
      undefined,
      { policy: { case: 'latest', value: 2 } },
      { policy: { case: 'specific', value: { versions: ['2', '4'] } } },
      { policy: { case: 'all', value: {} } },
    ];
    for (let i = 0; i < 500; i += 1) {
      const versions: ModelInit['versions'] = {};
      for (let id = 1; id <= 5; id += 1) {
        const state = pick(allStates);
        versions[String(id)] =
          state === DRAINING ? [DRAINING, pick([LEFT_SERVING_SET_REASON, RETIRING_REASON])] : state;
      }
      const m = model({
        versions,
        policy: pick(policies),
        rollout: pick([{}, { stableVersion: pick(['1', '3']) }]),
        unloaded: random.next() < 0.2,
      });
      const now = at(pick([0, GRACE_MS]));
      const once = applyLifecycle(m, now, GRACE_MS).model;
      expect({ before: states(m), again: applyLifecycle(once, now, GRACE_MS).transitions }).toEqual({
        before: states(m),
        again: [],
      });
      // Nothing outside the serving set is READY, nothing inside it is DRAINING.
      const set = servingSet(once);
      for (const v of once.versions) {
        const id = v.name.slice(v.name.lastIndexOf('/') + 1);
        if (v.state === READY) expect({ id, serving: set.has(id) }).toEqual({ id, serving: true });
        if (v.state === DRAINING) expect({ id, serving: set.has(id) }).toEqual({ id, serving: false });
      }
    }
  });
});

describe(whyServing.name, () => {
  it('says why a version takes traffic: the rollout names it, or the version policy selects it while READY', () => {
    const latest = model({
      versions: { '1': READY, '2': READY, '3': REGISTERED },
      rollout: { canary: { version: '1', percent: 5 } },
    });
    expect(whyServing(latest, '1')).toBe(
      'the rollout policy names it as the canary; change the rollout first (SetRolloutPolicy or UpdateRollout)',
    );
    expect(whyServing(latest, '2')).toBe(
      'it is the latest READY version under version policy latest 1; register a newer version or change the version policy first',
    );
    expect(whyServing(latest, '3')).toBeUndefined();
    const two = model({ versions: { '1': READY, '2': READY }, policy: { policy: { case: 'latest', value: 2 } } });
    expect(whyServing(two, '1')).toBe(
      'it is one of the 2 latest READY versions under version policy latest 2; register a newer version or change the version policy first',
    );
    const specific = model({
      versions: { '1': READY, '2': READY },
      policy: { policy: { case: 'specific', value: { versions: ['1', '2'] } } },
    });
    expect(whyServing(specific, '2')).toBe(
      'version policy specific [1, 2] selects it; change the version policy first',
    );
    expect(whyServing(model({ versions: { '1': DRAINING, '2': READY } }), '1')).toBeUndefined();
  });
});

describe(describeVersionPolicy.name, () => {
  it('names the default policy latest 1', () => {
    expect(describeVersionPolicy(undefined)).toBe('latest 1');
    expect(
      describeVersionPolicy(model({ versions: {}, policy: { policy: { case: 'all', value: {} } } }).versionPolicy),
    ).toBe('all');
  });
});
