import { RpcError } from '@infermesh/grpc';

// The registry's rules for ids (services/registry/src/resource-names.ts), checked here too so that a
// path segment never becomes more than one part of a resource name (a decoded %2F, say).
/** A model id: a letter or digit, then up to 63 letters, digits, `_`, `.` or `-`. */
const MODEL_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$/;
/** A version id: a positive integer without leading zeros. */
const VERSION_ID = /^[1-9][0-9]{0,14}$/;

/** `models/{model}` of a model id from a path; INVALID_ARGUMENT naming it when it is not one. */
export function modelResource(modelId: string): string {
  if (!MODEL_ID.test(modelId)) {
    throw RpcError.invalidArgument(
      `invalid model name "${modelId}": expected a letter or digit followed by up to 63 letters, digits, "_", "." or "-"`,
    );
  }
  return `models/${modelId}`;
}

export function checkVersionId(versionId: string): string {
  if (!VERSION_ID.test(versionId)) {
    throw RpcError.invalidArgument(`invalid version id "${versionId}": expected a positive integer such as "1"`);
  }
  return versionId;
}

/** `models/{model}/versions/{version}` of ids from a path. */
export function versionResource(modelId: string, versionId: string): string {
  return `${modelResource(modelId)}/versions/${checkVersionId(versionId)}`;
}
