import { create, equals } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  type Model,
  type RolloutPolicy,
  RolloutPolicySchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { versionIdOf } from '@infermesh/rollout';
import { isRetiring } from './version-lifecycle';

const invalid = (message: string) => Errors.invalidRequest(`rollout: ${message}`);
/** States a version never leaves: a rollout naming one would never send it a request. */
const ENDED = new Set([VersionState.FAILED, VersionState.RETIRED]);

/**
 * Checks a rollout policy against the model's versions and returns what to store: undefined when it
 * declares nothing. Refuses with INVALID_ARGUMENT, naming the problem: a version the model does not
 * have, or one that is FAILED, RETIRED or retired and draining; a percent that is not a number from 0 to 100; a version
 * named twice (stable, canary, variants and shadow are distinct); shares of the canary and the
 * variants that add up to more than 100.
 */
export function checkRollout(policy: RolloutPolicy | undefined, model: Model): RolloutPolicy | undefined {
  if (policy === undefined || equals(RolloutPolicySchema, policy, create(RolloutPolicySchema))) return undefined;
  const modelId = model.name.slice('models/'.length);
  const named = new Set<string>();
  const checkVersion = (versionId: string, role: string) => {
    const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
    if (version === undefined) {
      throw invalid(
        `the ${role} is version "${versionId}", which model "${modelId}" does not have; its versions are ${model.versions.map((v) => versionIdOf(v.name)).join(', ') || 'none'}`,
      );
    }
    if (ENDED.has(version.state))
      throw invalid(
        `the ${role} is version ${versionId}, which is ${VersionState[version.state]} and will never serve`,
      );
    if (isRetiring(version))
      throw invalid(
        `the ${role} is version ${versionId}, which was retired (it is DRAINING) and will never serve again`,
      );
    if (named.has(versionId)) throw invalid(`version ${versionId} is named more than once (as the ${role} too)`);
    named.add(versionId);
  };
  const checkPercent = (percent: number, role: string) => {
    if (!Number.isFinite(percent) || percent < 0 || percent > 100)
      throw invalid(`the ${role}'s percent is ${percent}; it must be from 0 to 100`);
    return percent;
  };
  if (policy.stableVersion !== '') checkVersion(policy.stableVersion, 'stable version');
  let total = 0;
  if (policy.canary !== undefined) {
    checkVersion(policy.canary.version, 'canary');
    total += checkPercent(policy.canary.percent, 'canary');
  }
  for (const variant of policy.variants) {
    checkVersion(variant.version, `variant ${variant.version}`);
    total += checkPercent(variant.percent, `variant ${variant.version}`);
  }
  if (total > 100) throw invalid(`the canary's and the variants' percents add up to ${total}, more than 100`);
  if (policy.shadow !== undefined) {
    checkVersion(policy.shadow.version, 'shadow');
    checkPercent(policy.shadow.percent, 'shadow');
  }
  return policy;
}
