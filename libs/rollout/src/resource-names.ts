import { Errors } from '@infermesh/grpc';

// The registry's rules for resource names, `models/{model}` and `models/{model}/versions/{version}`:
// the registry enforces them, and the services in front of it check them too (so that a path segment
// never becomes more than one part of a resource name, a decoded %2F say).

/** A model id: a letter or digit, then up to 63 letters, digits, `_`, `.` or `-`. */
const MODEL_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$/;
/** A version id: a positive integer without leading zeros, small enough to stay exact as a double. */
const VERSION_ID = /^[1-9][0-9]{0,14}$/;
const MODEL_NAME = /^models\/([^/]+)$/;
const VERSION_NAME = /^models\/([^/]+)\/versions\/([^/]+)$/;

/** `models/{model}`. */
export function modelName(modelId: string): string {
  return `models/${modelId}`;
}

/** `models/{model}/versions/{version}`. */
export function versionName(modelId: string, versionId: string): string {
  return `models/${modelId}/versions/${versionId}`;
}

/** `models/{model}` of a model id from outside (a path segment, say); INVALID_ARGUMENT naming it when it is not one. */
export function checkedModelName(modelId: string): string {
  return modelName(checkModelId(modelId));
}

/** `models/{model}/versions/{version}` of ids from outside; INVALID_ARGUMENT naming the one that is not one. */
export function checkedVersionName(modelId: string, versionId: string): string {
  return versionName(checkModelId(modelId), checkVersionId(versionId));
}

/** Whether a string is a valid model id. */
export function isModelId(modelId: string): boolean {
  return MODEL_ID.test(modelId);
}

/** Whether a string is a valid version id: a positive integer such as "1". */
export function isVersionId(versionId: string): boolean {
  return VERSION_ID.test(versionId);
}

/** The model id, unchanged; INVALID_ARGUMENT naming it when it is not one. */
export function checkModelId(modelId: string): string {
  if (!isModelId(modelId)) {
    throw Errors.invalidRequest(
      `invalid model name "${modelId}": expected a letter or digit followed by up to 63 letters, digits, "_", "." or "-"`,
    );
  }
  return modelId;
}

/** The version id, unchanged; INVALID_ARGUMENT naming it when it is not one. */
export function checkVersionId(versionId: string): string {
  if (!isVersionId(versionId)) {
    throw Errors.invalidRequest(`invalid version id "${versionId}": expected a positive integer such as "1"`);
  }
  return versionId;
}

/** The model id of a name shaped `models/{model}`, or undefined when it is not (the id itself is not checked). */
export function splitModelName(name: string): string | undefined {
  return MODEL_NAME.exec(name)?.[1];
}

/** The ids of a name shaped `models/{model}/versions/{version}`, or undefined when it is not (the ids themselves are not checked). */
export function splitVersionName(name: string): { modelId: string; versionId: string } | undefined {
  const match = VERSION_NAME.exec(name);
  return match === null ? undefined : { modelId: match[1]!, versionId: match[2]! };
}

/** The model id of a model's resource name: "mlp" of "models/mlp". */
export function modelIdOf(modelResourceName: string): string {
  return modelResourceName.startsWith('models/') ? modelResourceName.slice('models/'.length) : modelResourceName;
}

/** The model's resource name of a version's: "models/mlp" of "models/mlp/versions/3". */
export function modelNameOf(versionResourceName: string): string {
  return versionResourceName.slice(0, versionResourceName.lastIndexOf('/versions/'));
}

/** The version id at the end of a version's resource name: "3" of "models/mlp/versions/3". */
export function versionIdOf(versionResourceName: string): string {
  return versionResourceName.slice(versionResourceName.lastIndexOf('/') + 1);
}
