import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { ModelSchema, VersionPolicySchema, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { thrownBy } from '@infermesh/testing';
import { checkLabels, checkUpdateMask, checkVersionPolicy } from './model-update-check';
import { RETIRING_REASON } from './version-lifecycle';

/** The INVALID_ARGUMENT message a check throws. */
function refusal(check: () => unknown): string {
  const error = thrownBy(check, RpcError);
  expect(error.code).toBe(status.INVALID_ARGUMENT);
  return error.message;
}

const model = create(ModelSchema, {
  name: 'models/mlp',
  versions: [
    { name: 'models/mlp/versions/1', state: VersionState.RETIRED },
    { name: 'models/mlp/versions/2', state: VersionState.DRAINING, stateReason: RETIRING_REASON },
    { name: 'models/mlp/versions/3', state: VersionState.READY },
    { name: 'models/mlp/versions/4', state: VersionState.REGISTERED },
  ],
});
const policy = (init: MessageInitShape<typeof VersionPolicySchema>) => create(VersionPolicySchema, init);

describe(checkUpdateMask.name, () => {
  it('takes labels, pinned, version_policy and unloaded', () => {
    expect([...checkUpdateMask(['labels', 'pinned', 'version_policy', 'unloaded', 'pinned'])]).toEqual([
      'labels',
      'pinned',
      'version_policy',
      'unloaded',
    ]);
  });

  it('refuses an empty mask and any other path, naming it', () => {
    expect(refusal(() => checkUpdateMask([]))).toBe(
      'update_mask names no field; name one or more of labels, pinned, version_policy, unloaded',
    );
    for (const path of ['versions', 'rollout', 'cache', 'name', 'revision', 'versionPolicy', 'labels.team']) {
      expect(refusal(() => checkUpdateMask(['labels', path]))).toBe(
        `update_mask: "${path}" cannot be changed with UpdateModel; only labels, pinned, version_policy, unloaded can (versions, rollout and cache have their own RPCs)`,
      );
    }
  });
});

describe(checkLabels.name, () => {
  it('takes up to 64 labels with keys of 1 to 63 characters of [a-z0-9_.-] and values of up to 256 characters', () => {
    const many = Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`key-${i}`, 'v']));
    expect(checkLabels(many)).toEqual(many);
    expect(checkLabels({ [`a${'b'.repeat(62)}`]: 'é'.repeat(256), 'team.ml_ops-1': '' })).toEqual({
      [`a${'b'.repeat(62)}`]: 'é'.repeat(256),
      'team.ml_ops-1': '',
    });
  });

  it('refuses bad keys, long values and too many labels, naming the offender', () => {
    expect(refusal(() => checkLabels({ Team: 'x' }))).toBe(
      'labels: key "Team" must be 1 to 63 characters of a-z, 0-9, "_", "." and "-"',
    );
    expect(refusal(() => checkLabels({ '': 'x' }))).toMatch(/^labels: key "" must be/);
    expect(refusal(() => checkLabels({ ['k'.repeat(64)]: 'x' }))).toMatch(/^labels: key "k{64}" must be 1 to 63/);
    expect(refusal(() => checkLabels({ 'team/x': 'x' }))).toMatch(/^labels: key "team\/x"/);
    expect(refusal(() => checkLabels({ team: 'v'.repeat(257) }))).toBe(
      'labels: the value of "team" has 257 characters; at most 256',
    );
    const tooMany = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v']));
    expect(refusal(() => checkLabels(tooMany))).toBe('labels: 65 labels; a model has at most 64');
  });
});

describe(checkVersionPolicy.name, () => {
  it('takes latest N ≥ 1, all, specific versions the model has, and unset (the default)', () => {
    expect(checkVersionPolicy(policy({ policy: { case: 'latest', value: 3 } }), model)?.policy).toEqual({
      case: 'latest',
      value: 3,
    });
    expect(checkVersionPolicy(policy({ policy: { case: 'all', value: {} } }), model)?.policy.case).toBe('all');
    expect(
      checkVersionPolicy(policy({ policy: { case: 'specific', value: { versions: ['3', '4'] } } }), model)?.policy.case,
    ).toBe('specific');
    expect(checkVersionPolicy(undefined, model)).toBeUndefined();
    expect(checkVersionPolicy(policy({}), model)).toBeUndefined();
  });

  it('refuses latest 0, an empty, invalid, duplicate, unknown or retired specific version, naming the problem', () => {
    const specific = (versions: string[]) => policy({ policy: { case: 'specific', value: { versions } } });
    expect(refusal(() => checkVersionPolicy(policy({ policy: { case: 'latest', value: 0 } }), model))).toBe(
      'version_policy: latest is 0; it must be at least 1',
    );
    expect(refusal(() => checkVersionPolicy(specific([]), model))).toBe(
      'version_policy: specific names no version; name at least one, or use latest or all',
    );
    expect(refusal(() => checkVersionPolicy(specific(['v3']), model))).toBe(
      'version_policy: "v3" is not a version id; expected a positive integer such as "1"',
    );
    expect(refusal(() => checkVersionPolicy(specific(['3', '3']), model))).toBe(
      'version_policy: version 3 is named more than once',
    );
    expect(refusal(() => checkVersionPolicy(specific(['3', '9']), model))).toBe(
      'version_policy: model "mlp" has no version 9; its versions are 1, 2, 3, 4',
    );
    expect(refusal(() => checkVersionPolicy(specific(['1']), model))).toBe(
      'version_policy: version 1 is RETIRED, retired for good, and will never serve again',
    );
    expect(refusal(() => checkVersionPolicy(specific(['2']), model))).toBe(
      'version_policy: version 2 is DRAINING, retired for good, and will never serve again',
    );
  });
});
