import { RpcError } from '@infermesh/grpc';
import { checkModelId, checkVersionId, splitModelName, splitVersionName } from '@infermesh/rollout';

/** The model id of a `models/{model}` resource name; `field` names the request field in errors. */
export function parseModelName(name: string, field: string): string {
  const modelId = splitModelName(name);
  if (modelId === undefined) throw RpcError.invalidArgument(`${field} must be "models/{model}", got "${name}"`);
  return checkModelId(modelId);
}

/** The model and version ids of a `models/{model}/versions/{version}` resource name. */
export function parseVersionName(name: string, field: string): { modelId: string; versionId: string } {
  const ids = splitVersionName(name);
  if (ids === undefined)
    throw RpcError.invalidArgument(`${field} must be "models/{model}/versions/{version}", got "${name}"`);
  return { modelId: checkModelId(ids.modelId), versionId: checkVersionId(ids.versionId) };
}
