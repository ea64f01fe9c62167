import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import { boundedText, integerParameter, quoted } from '@infermesh/tensors';
import { type InferParameter, InferParameterSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';

export type JsonParameter = boolean | number | string;

/** KServe JSON parameters ({name: bool | number | string}) as InferParameter messages. */
export function parametersFromJson(where: string, value: unknown): Record<string, InferParameter> {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw Errors.invalidRequest(`${where} "parameters" must be an object`);
  }
  const out: Record<string, InferParameter> = {};
  for (const [key, v] of Object.entries(value)) out[key] = parameterFromJson(where, key, v);
  return out;
}

function parameterFromJson(where: string, key: string, value: unknown): InferParameter {
  switch (typeof value) {
    case 'boolean':
      return create(InferParameterSchema, { parameterChoice: { case: 'boolParam', value } });
    case 'string':
      return create(InferParameterSchema, { parameterChoice: { case: 'stringParam', value } });
    case 'number':
      return Number.isSafeInteger(value)
        ? create(InferParameterSchema, { parameterChoice: { case: 'int64Param', value: BigInt(value) } })
        : create(InferParameterSchema, { parameterChoice: { case: 'doubleParam', value } });
    default:
      throw Errors.invalidRequest(`${where} parameter ${quoted(key)} must be a boolean, a number or a string`);
  }
}

/** InferParameter messages as JSON values; 64-bit integers beyond 2^53 become decimal strings. */
export function parametersToJson(parameters: Readonly<Record<string, InferParameter>>): Record<string, JsonParameter> {
  const out: Record<string, JsonParameter> = {};
  for (const [key, parameter] of Object.entries(parameters)) {
    const choice = parameter.parameterChoice;
    switch (choice.case) {
      case 'boolParam':
      case 'stringParam':
      case 'doubleParam':
        out[key] = choice.value;
        break;
      case 'int64Param':
      case 'uint64Param':
        out[key] = safeNumber(choice.value);
        break;
      case undefined:
        break;
    }
  }
  return out;
}

export function boolParameter(value: boolean): InferParameter {
  return create(InferParameterSchema, { parameterChoice: { case: 'boolParam', value } });
}

function safeNumber(value: bigint): number | string {
  return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
    ? Number(value)
    : value.toString();
}

/** What a request's own parameters say at the edge: its timeout, checked like its priority. */
export interface EdgeParameters {
  /** Triton's `timeout` parameter in milliseconds; undefined when absent. */
  timeoutMs: number | undefined;
}

/**
 * Checks the numeric request parameters the gateway reads before anything is sent on: Triton's
 * `timeout` (microseconds, a positive integer; a long one is cut to GATEWAY_MAX_REQUEST_TIMEOUT_MS
 * later) and `priority` (a non-negative integer; the batcher checks it against the model's levels).
 * Anything else, a negative, fractional or non-number value, is an INVALID_ARGUMENT naming it.
 */
export function edgeParameters(parameters: Readonly<Record<string, InferParameter>>): EdgeParameters {
  const priority = parameters['priority'];
  if (priority !== undefined && !(integerParameter(priority) >= 0)) {
    throw Errors.invalidRequest(
      `parameter "priority" must be a non-negative integer (0 for the model's default level), got ${shownParameter(priority)}`,
    );
  }
  const timeout = parameters['timeout'];
  if (timeout === undefined) return { timeoutMs: undefined };
  const us = integerParameter(timeout);
  if (!(us > 0))
    throw Errors.invalidRequest(
      `parameter "timeout" must be a positive integer of microseconds, got ${shownParameter(timeout)}`,
    );
  return { timeoutMs: Math.max(1, Math.ceil(us / 1000)) };
}

/** A parameter's value as a message shows it, at most 40 characters of a string. */
function shownParameter(parameter: InferParameter): string {
  const choice = parameter.parameterChoice;
  if (choice.case === undefined) return 'empty';
  if (choice.case === 'stringParam') return JSON.stringify(boundedText(choice.value, 40));
  return String(choice.value);
}

/** The largest class_count: the internal request carries it as a uint32. */
const MAX_CLASS_COUNT = 0xffff_ffff;

/**
 * The class counts asked of requested outputs by name: Triton's classification extension, a
 * `class_count` parameter on a requested output, for its top classes instead of its values. A
 * class_count that is not a positive integer, or an output asked for twice with different class
 * counts, is an INVALID_ARGUMENT naming the output.
 */
export function outputClassCounts(
  outputs: readonly { name: string; parameters: Readonly<Record<string, InferParameter>> }[],
): Record<string, number> {
  const counts: Record<string, number> = {};
  const given = new Map<string, number | undefined>();
  for (const { name, parameters } of outputs) {
    const count = classCountParameter(name, parameters);
    if (given.has(name) && given.get(name) !== count) {
      throw Errors.invalidTensor(
        `output ${quoted(name)} is requested more than once with different class_count parameters`,
      );
    }
    given.set(name, count);
    if (count !== undefined) counts[name] = count;
  }
  return counts;
}

function classCountParameter(output: string, parameters: Readonly<Record<string, InferParameter>>): number | undefined {
  const parameter = parameters['class_count'];
  if (parameter === undefined) return undefined;
  const count = integerParameter(parameter);
  if (!(count >= 1 && count <= MAX_CLASS_COUNT)) {
    throw Errors.invalidTensor(
      `output ${quoted(output)}: parameter "class_count" must be a positive integer (at most ${MAX_CLASS_COUNT}), got ${shownParameter(parameter)}`,
    );
  }
  return count;
}
