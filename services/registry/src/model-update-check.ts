import { Errors } from '@infermesh/grpc';
import type { Model, VersionPolicy } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { isVersionId, versionIdOf } from '@infermesh/rollout';
import { hasEnded, stateName } from './version-lifecycle';

/** The fields of Model that UpdateModel changes; the others have their own RPCs. */
export const UPDATABLE_FIELDS = ['labels', 'pinned', 'version_policy', 'unloaded'] as const;
export type UpdatableField = (typeof UPDATABLE_FIELDS)[number];

const LABEL_KEY = /^[a-z0-9_.-]{1,63}$/;
const MAX_LABEL_VALUE_CHARS = 256;
const MAX_LABELS = 64;

/**
 * The fields an update mask names, checked: at least one, each one of labels, pinned, version_policy
 * and unloaded. Refuses anything else with INVALID_ARGUMENT naming the path.
 */
export function checkUpdateMask(paths: readonly string[]): Set<UpdatableField> {
  const allowed = UPDATABLE_FIELDS.join(', ');
  if (paths.length === 0) throw Errors.invalidRequest(`update_mask names no field; name one or more of ${allowed}`);
  const fields = new Set<UpdatableField>();
  for (const path of paths) {
    if (!(UPDATABLE_FIELDS as readonly string[]).includes(path)) {
      throw Errors.invalidRequest(
        `update_mask: "${path}" cannot be changed with UpdateModel; only ${allowed} can (versions, rollout and cache have their own RPCs)`,
      );
    }
    fields.add(path as UpdatableField);
  }
  return fields;
}

/** Checks labels: at most 64; keys 1 to 63 characters of a-z, 0-9, "_", "." and "-"; values at most 256 characters. */
export function checkLabels(labels: Readonly<Record<string, string>>): Record<string, string> {
  const entries = Object.entries(labels);
  if (entries.length > MAX_LABELS)
    throw Errors.invalidRequest(`labels: ${entries.length} labels; a model has at most ${MAX_LABELS}`);
  for (const [key, value] of entries) {
    if (!LABEL_KEY.test(key)) {
      throw Errors.invalidRequest(`labels: key "${key}" must be 1 to 63 characters of a-z, 0-9, "_", "." and "-"`);
    }
    if ([...value].length > MAX_LABEL_VALUE_CHARS) {
      throw Errors.invalidRequest(
        `labels: the value of "${key}" has ${[...value].length} characters; at most ${MAX_LABEL_VALUE_CHARS}`,
      );
    }
  }
  return { ...labels };
}

/**
 * Checks a version policy against the model's versions and returns what to store: undefined for an
 * unset policy (the default, latest 1). `latest` must be at least 1; `specific` must name at least one
 * version, each a version of the model that is not RETIRED, none twice.
 */
export function checkVersionPolicy(policy: VersionPolicy | undefined, model: Model): VersionPolicy | undefined {
  const selection = policy?.policy;
  const modelId = model.name.slice('models/'.length);
  switch (selection?.case) {
    case undefined:
      return undefined;
    case 'latest':
      if (selection.value < 1)
        throw Errors.invalidRequest(`version_policy: latest is ${selection.value}; it must be at least 1`);
      return policy;
    case 'all':
      return policy;
    case 'specific': {
      const versions = selection.value.versions;
      if (versions.length === 0)
        throw Errors.invalidRequest(
          'version_policy: specific names no version; name at least one, or use latest or all',
        );
      const seen = new Set<string>();
      for (const id of versions) {
        if (!isVersionId(id))
          throw Errors.invalidRequest(
            `version_policy: "${id}" is not a version id; expected a positive integer such as "1"`,
          );
        if (seen.has(id)) throw Errors.invalidRequest(`version_policy: version ${id} is named more than once`);
        seen.add(id);
        const version = model.versions.find((v) => versionIdOf(v.name) === id);
        if (version === undefined) {
          throw Errors.invalidRequest(
            `version_policy: model "${modelId}" has no version ${id}; its versions are ${model.versions.map((v) => versionIdOf(v.name)).join(', ') || 'none'}`,
          );
        }
        if (hasEnded(version))
          throw Errors.invalidRequest(
            `version_policy: version ${id} is ${stateName(version.state)}, retired for good, and will never serve again`,
          );
      }
      return policy;
    }
  }
}
