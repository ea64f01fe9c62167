import { type DescMessage, fromJson, type JsonObject, type MessageShape, toJson } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';

/** A request body that must be a JSON object; `what` names it in the error. */
export function jsonObject(body: unknown, what: string): JsonObject {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw Errors.invalidRequest(`the request body must be a JSON object: ${what}`);
  }
  return body as JsonObject;
}

/**
 * A message from a JSON request body in the protobuf JSON mapping (field names in
 * lowerCamelCase or as in the .proto file). Anything but a JSON object, an unknown field or a value
 * of the wrong type is an INVALID_ARGUMENT naming the problem.
 */
export function messageFromJson<D extends DescMessage>(schema: D, body: unknown): MessageShape<D> {
  const json = jsonObject(body, `a ${schema.typeName} in the protobuf JSON mapping`);
  try {
    return fromJson(schema, json);
  } catch (error) {
    throw Errors.invalidRequest(`invalid request body: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/** A message as a JSON response body, in the protobuf JSON mapping. */
export function messageToJson<D extends DescMessage>(schema: D, message: MessageShape<D>): JsonObject {
  return toJson(schema, message) as JsonObject;
}
