import { checkModelId, checkVersionId, modelName, versionName } from '@infermesh/rollout';

// The registry's rules for ids, checked here too so that a path segment never becomes more than one
// part of a resource name (a decoded %2F, say).

/** `models/{model}` of a model id from a path; INVALID_ARGUMENT naming it when it is not one. */
export function modelResource(modelId: string): string {
  return modelName(checkModelId(modelId));
}

/** `models/{model}/versions/{version}` of ids from a path. */
export function versionResource(modelId: string, versionId: string): string {
  return versionName(checkModelId(modelId), checkVersionId(versionId));
}
