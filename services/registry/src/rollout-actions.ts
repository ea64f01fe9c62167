import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  type Model,
  type RolloutPolicy,
  RolloutPolicySchema,
  type UpdateRolloutRequest,
  VersionState,
  WeightedVersionSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { compareVersionIds, versionIdOf } from '@infermesh/rollout';
import { isRetiring } from './version-lifecycle';

const invalid = (message: string) => Errors.invalidRequest(`rollout: ${message}`);

/**
 * The policy an UpdateRollout action makes of the model's current one (checked by the caller like
 * any policy): promote a canary or variant to stable, roll back to the stable version, or set new
 * shares (pause leaves it as it is). An action the current policy leaves nothing to do for is
 * FAILED_PRECONDITION.
 */
export function applyRolloutAction(model: Model, action: UpdateRolloutRequest['action']): RolloutPolicy {
  const current = model.rollout ?? create(RolloutPolicySchema);
  const modelId = model.name.slice('models/'.length);
  const trial = [
    ...(current.canary !== undefined ? [current.canary.version] : []),
    ...current.variants.map((v) => v.version),
  ];
  switch (action.case) {
    case 'promote': {
      const version = action.value === '' ? current.canary?.version : action.value;
      if (version === undefined)
        throw Errors.noRolloutInProgress(`rollout: model "${modelId}" has no canary to promote`);
      if (!trial.includes(version))
        throw invalid(
          `version ${version} is neither the canary nor a variant of model "${modelId}"; it has ${trial.join(', ') || 'none'}`,
        );
      return create(RolloutPolicySchema, { ...withoutTrial(current), stableVersion: version });
    }
    case 'rollback': {
      if (trial.length === 0)
        throw Errors.noRolloutInProgress(`rollout: model "${modelId}" has no canary or variant to roll back`);
      let stable = current.stableVersion;
      if (stable === '') {
        // A version that left the serving set when the trial took over drains for a while and may
        // still be rolled back to.
        const before = model.versions
          .filter(
            (v) =>
              (v.state === VersionState.READY || (v.state === VersionState.DRAINING && !isRetiring(v))) &&
              !trial.includes(versionIdOf(v.name)),
          )
          .sort((a, b) => compareVersionIds(versionIdOf(b.name), versionIdOf(a.name)))[0];
        if (before === undefined)
          throw Errors.noStableVersion(
            `rollout: model "${modelId}" has no READY (or still draining) version outside its rollout to roll back to`,
          );
        stable = versionIdOf(before.name);
      }
      return create(RolloutPolicySchema, { ...withoutTrial(current), stableVersion: stable });
    }
    case 'setWeights': {
      const percents = action.value.percents;
      for (const version of Object.keys(percents)) {
        if (!trial.includes(version))
          throw invalid(
            `version ${version} is neither the canary nor a variant of model "${modelId}"; it has ${trial.join(', ') || 'none'}`,
          );
      }
      const share = (version: string, percent: number) =>
        create(WeightedVersionSchema, { version, percent: percents[version] ?? percent });
      return create(RolloutPolicySchema, {
        ...current,
        ...(current.canary !== undefined && { canary: share(current.canary.version, current.canary.percent) }),
        variants: current.variants.map((v) => share(v.version, v.percent)),
      });
    }
    case 'pause':
      // Pauses the model's automatic rollout (the catalog does); the policy stays.
      return current;
    case undefined:
      throw Errors.invalidRequest('the request names no action: promote, rollback, set_weights or pause');
  }
}

function withoutTrial(policy: RolloutPolicy): Omit<RolloutPolicy, 'canary' | 'variants'> & { variants: [] } {
  const { canary: _canary, variants: _variants, ...rest } = policy;
  return { ...rest, variants: [] };
}
