import { create } from '@bufbuild/protobuf';
import { RpcError } from '@infermesh/grpc';
import { integerParameter } from '@infermesh/tensors';
import { type InferParameter, InferParameterSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';

export type JsonParameter = boolean | number | string;

/** KServe JSON parameters ({name: bool | number | string}) as InferParameter messages. */
export function parametersFromJson(where: string, value: unknown): Record<string, InferParameter> {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw RpcError.invalidArgument(`${where} "parameters" must be an object`);
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
      throw RpcError.invalidArgument(`${where} parameter "${key}" must be a boolean, a number or a string`);
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
  return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value.toString();
}

/**
 * The Triton `timeout` parameter (microseconds) in milliseconds; undefined when absent. A value that
 * is not a positive integer is an INVALID_ARGUMENT.
 */
export function timeoutParameterMs(parameters: Readonly<Record<string, InferParameter>>): number | undefined {
  const parameter = parameters['timeout'];
  if (parameter === undefined) return undefined;
  const us = integerParameter(parameter);
  if (!(us > 0)) throw RpcError.invalidArgument('parameter "timeout" must be a positive integer of microseconds');
  return Math.max(1, Math.ceil(us / 1000));
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
      throw RpcError.invalidArgument(`output "${name}" is requested more than once with different class_count parameters`, 'INVALID_TENSOR');
    }
    given.set(name, count);
    if (count !== undefined) counts[name] = count;
  }
  return counts;
}

function classCountParameter(output: string, parameters: Readonly<Record<string, InferParameter>>): number | undefined {
  const parameter = parameters['class_count'];
  if (parameter === undefined) return undefined;
  const choice = parameter.parameterChoice;
  const count = integerParameter(parameter);
  if (!(count >= 1 && count <= MAX_CLASS_COUNT)) {
    const shown = choice.case === undefined ? 'empty' : choice.case === 'stringParam' ? JSON.stringify(choice.value) : String(choice.value);
    throw RpcError.invalidArgument(
      `output "${output}": parameter "class_count" must be a positive integer (at most ${MAX_CLASS_COUNT}), got ${shown}`,
      'INVALID_TENSOR',
    );
  }
  return count;
}
