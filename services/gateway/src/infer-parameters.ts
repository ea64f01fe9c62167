import { create } from '@bufbuild/protobuf';
import { RpcError } from '@infermesh/grpc';
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
  const choice = parameter.parameterChoice;
  const us =
    choice.case === 'int64Param' || choice.case === 'uint64Param'
      ? Number(choice.value)
      : choice.case === 'doubleParam' && Number.isInteger(choice.value)
        ? choice.value
        : NaN;
  if (!(us > 0)) throw RpcError.invalidArgument('parameter "timeout" must be a positive integer of microseconds');
  return Math.max(1, Math.ceil(us / 1000));
}
