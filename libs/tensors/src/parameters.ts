import type { InferParameter } from '@infermesh/proto/gen/inference/grpc_service_pb';

/**
 * The integer an InferParameter holds: an int64 or uint64 parameter, or a double with no fraction
 * (how JSON numbers may arrive). NaN for anything else, so that range checks refuse it.
 */
export function integerParameter(parameter: InferParameter): number {
  const choice = parameter.parameterChoice;
  if (choice.case === 'int64Param' || choice.case === 'uint64Param') return Number(choice.value);
  if (choice.case === 'doubleParam' && Number.isInteger(choice.value)) return choice.value;
  return NaN;
}
