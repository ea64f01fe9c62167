import { RpcError } from '@infermesh/grpc';

/** A model name: a letter or digit, then up to 63 letters, digits, `_`, `.` or `-`. */
const MODEL_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$/;
/** A version id: a positive integer without leading zeros, small enough to stay exact as a double. */
const VERSION_ID = /^[1-9][0-9]{0,14}$/;

export function modelName(modelId: string): string {
  return `models/${modelId}`;
}

export function versionName(modelId: string, versionId: string): string {
  return `models/${modelId}/versions/${versionId}`;
}

export function checkModelId(modelId: string): string {
  if (!MODEL_ID.test(modelId)) {
    throw RpcError.invalidArgument(
      `invalid model name "${modelId}": expected a letter or digit followed by up to 63 letters, digits, "_", "." or "-"`,
    );
  }
  return modelId;
}

/** Whether a string is a valid version id: a positive integer such as "1". */
export function isVersionId(versionId: string): boolean {
  return VERSION_ID.test(versionId);
}

export function checkVersionId(versionId: string): string {
  if (!isVersionId(versionId)) {
    throw RpcError.invalidArgument(`invalid version id "${versionId}": expected a positive integer such as "1"`);
  }
  return versionId;
}

/** The model id of a `models/{model}` resource name; `field` names the request field in errors. */
export function parseModelName(name: string, field: string): string {
  const match = /^models\/([^/]+)$/.exec(name);
  if (match === null) throw RpcError.invalidArgument(`${field} must be "models/{model}", got "${name}"`);
  return checkModelId(match[1]!);
}

/** The model and version ids of a `models/{model}/versions/{version}` resource name. */
export function parseVersionName(name: string, field: string): { modelId: string; versionId: string } {
  const match = /^models\/([^/]+)\/versions\/([^/]+)$/.exec(name);
  if (match === null) throw RpcError.invalidArgument(`${field} must be "models/{model}/versions/{version}", got "${name}"`);
  return { modelId: checkModelId(match[1]!), versionId: checkVersionId(match[2]!) };
}
