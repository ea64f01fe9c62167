import { Errors } from '@infermesh/grpc';
import { checkModelId, checkVersionId, splitModelName, splitVersionName } from '@infermesh/rollout';

// The resource names in the registry's requests, checked field by field: libs/rollout's
// resource-names.ts holds the rules (the shapes of the names, what an id may be); this turns a
// request's `name`, `parent` or `model` field into its ids, or an INVALID_ARGUMENT naming the field.

/** The model id of a `models/{model}` resource name; `field` names the request field in errors. */
export function parseModelName(name: string, field: string): string {
  const modelId = splitModelName(name);
  if (modelId === undefined) throw Errors.invalidRequest(`${field} must be "models/{model}", got "${name}"`);
  return checkModelId(modelId);
}

/** The model and version ids of a `models/{model}/versions/{version}` resource name. */
export function parseVersionName(name: string, field: string): { modelId: string; versionId: string } {
  const ids = splitVersionName(name);
  if (ids === undefined)
    throw Errors.invalidRequest(`${field} must be "models/{model}/versions/{version}", got "${name}"`);
  return { modelId: checkModelId(ids.modelId), versionId: checkVersionId(ids.versionId) };
}
