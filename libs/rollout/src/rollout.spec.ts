import { create, type MessageInitShape } from '@bufbuild/protobuf';
import {
  type Model,
  ModelSchema,
  type RolloutPolicySchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { versionIdOf } from './resource-names';
import { latestReady, route, stableVersion, stickyBucket } from './rollout';

/** Model "m" with versions 1..4 in the given states (READY by default). */
function model(
  rollout?: MessageInitShape<typeof RolloutPolicySchema>,
  states: Record<string, VersionState> = {},
): Model {
  return create(ModelSchema, {
    name: 'models/m',
    versions: ['1', '2', '3', '4'].map((id) => ({
      name: `models/m/versions/${id}`,
      state: states[id] ?? VersionState.READY,
    })),
    ...(rollout !== undefined && { rollout }),
  });
}

/** A seeded uniform PRNG (mulberry32), so that shares are checked on a fixed sequence. */
function seeded(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const served = (m: Model, key: string, random: () => number) => versionIdOf(route(m, key, random)!.version.name);

describe('route', () => {
  it('sends every request to the latest READY version without a policy', () => {
    const m = model(undefined, { '4': VersionState.LOADING });
    expect(route(m, 'k', seeded(1))).toMatchObject({ kind: 'stable', version: { name: 'models/m/versions/3' } });
    expect(
      latestReady(
        model(
          {},
          { '1': VersionState.FAILED, '2': VersionState.FAILED, '3': VersionState.FAILED, '4': VersionState.FAILED },
        ),
      ),
    ).toBeUndefined();
  });

  it('sends the stable version what the canary leaves: a random share of requests', () => {
    const m = model({ stableVersion: '2', canary: { version: '3', percent: 10 } });
    const random = seeded(7);
    const counts = new Map<string, number>();
    for (let i = 0; i < 10_000; i++) {
      const version = served(m, '', random);
      counts.set(version, (counts.get(version) ?? 0) + 1);
    }
    expect(counts.get('3')! / 10_000).toBeGreaterThan(0.08);
    expect(counts.get('3')! / 10_000).toBeLessThan(0.12);
    expect([...counts.keys()].sort()).toEqual(['2', '3']);
  });

  it('keeps a routing key on its variant, and moves only the keys that must when a share grows', () => {
    const keys = Array.from({ length: 1_000 }, (_, i) => `user-${i}`);
    const before = model({ stableVersion: '1', variants: [{ version: '2', percent: 10 }] });
    const after = model({ stableVersion: '1', variants: [{ version: '2', percent: 50 }] });
    const random = seeded(3);
    const assigned = keys.map((k) => served(before, k, random));
    expect(keys.map((k) => served(before, k, random))).toEqual(assigned);
    const moved = keys.map((k) => served(after, k, random));

    for (let i = 0; i < keys.length; i++) if (assigned[i] === '2') expect(moved[i]).toBe('2');
    const onB = (list: string[]) => list.filter((v) => v === '2').length;
    expect(onB(assigned)).toBeGreaterThan(60);
    expect(onB(assigned)).toBeLessThan(140);
    expect(onB(moved)).toBeGreaterThan(440);
    expect(onB(moved)).toBeLessThan(560);
  });

  it('passes a request on when the chosen version is not READY', () => {
    const m = model(
      { stableVersion: '1', canary: { version: '3', percent: 100 } },
      { '3': VersionState.LOADING, '1': VersionState.DRAINING },
    );
    expect(route(m, '', seeded(1))).toMatchObject({ kind: 'stable', version: { name: 'models/m/versions/4' } });
    expect(stableVersion(m)!.name).toBe('models/m/versions/4');
  });

  it('places a key by model: the same key may land differently in two models', () => {
    const bucket = stickyBucket('models/a', 'k');
    expect(bucket).toBeGreaterThanOrEqual(0);
    expect(bucket).toBeLessThan(100);
    expect(stickyBucket('models/a', 'k')).toBe(bucket);
    expect(stickyBucket('models/b', 'k')).not.toBe(bucket);
  });
});
