import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  type Tensor,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeName, jsonToRaw, rawToJson, TensorDataError } from '@infermesh/tensors';
import { type JsonParameter, outputClassCounts, parametersFromJson, parametersToJson } from './infer-parameters';
import { checkBytesElements, tensorDatatype, tensorElementCount } from './tensor-shape';

/** A KServe v2 REST inference response. */
export interface JsonInferResponse {
  model_name: string;
  model_version: string;
  id?: string;
  parameters: Record<string, JsonParameter>;
  outputs: JsonOutputTensor[];
}

export interface JsonOutputTensor {
  name: string;
  datatype: string;
  shape: number[];
  data: unknown[];
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * A KServe v2 REST inference request body as the internal request: each input's data (flat or
 * nested, row-major) becomes raw little-endian bytes, checked against its datatype and shape.
 */
export function inferRequestFromJson(model: string, version: string, body: unknown): InferenceRequest {
  if (!isObject(body)) throw RpcError.invalidArgument('the request body must be a JSON object with "inputs"');
  if (body['id'] !== undefined && typeof body['id'] !== 'string') throw RpcError.invalidArgument('"id" must be a string');
  const rawInputs = body['inputs'];
  if (!Array.isArray(rawInputs) || rawInputs.length === 0) {
    throw RpcError.invalidArgument('"inputs" must be a non-empty array of tensors');
  }
  const seen = new Set<string>();
  const inputs = rawInputs.map((input: unknown, i) => {
    const tensor = inputFromJson(input, i);
    if (seen.has(tensor.name)) throw RpcError.invalidArgument(`input "${tensor.name}" is given more than once`, 'INVALID_TENSOR');
    seen.add(tensor.name);
    return tensor;
  });
  return create(InferenceRequestSchema, {
    modelName: model,
    modelVersion: version,
    id: body['id'] ?? '',
    inputs,
    ...requestedOutputsFromJson(body['outputs']),
    parameters: parametersFromJson('the request', body['parameters']),
  });
}

function inputFromJson(input: unknown, index: number): Tensor {
  if (!isObject(input)) throw RpcError.invalidArgument(`inputs[${index}] must be an object`, 'INVALID_TENSOR');
  const name = input['name'];
  if (typeof name !== 'string' || name === '') {
    throw RpcError.invalidArgument(`inputs[${index}] needs a "name" string`, 'INVALID_TENSOR');
  }
  const parameters = parametersFromJson(`input "${name}"`, input['parameters']);
  if ('binary_data_size' in parameters) {
    throw RpcError.invalidArgument(`input "${name}": the binary tensor data extension is not supported; send "data" as JSON`, 'INVALID_TENSOR');
  }
  if ('shared_memory_region' in parameters) {
    throw RpcError.invalidArgument(`input "${name}": shared memory is not supported; send "data"`, 'INVALID_TENSOR');
  }
  const shape = input['shape'];
  if (!Array.isArray(shape) || shape.some((d) => typeof d !== 'number')) {
    throw RpcError.invalidArgument(`input "${name}" needs a "shape" array of integers`, 'INVALID_TENSOR');
  }
  const count = tensorElementCount(name, shape as number[]);
  const datatype = tensorDatatype(name, input['datatype']);
  if (input['data'] === undefined) throw RpcError.invalidArgument(`input "${name}" has no "data"`, 'INVALID_TENSOR');
  let data: Buffer;
  try {
    data = jsonToRaw(name, datatype, input['data'], count);
  } catch (error) {
    if (error instanceof TensorDataError) throw RpcError.invalidArgument(error.message, 'INVALID_TENSOR');
    throw error;
  }
  const tensor = create(TensorSchema, { name, datatype, shape: (shape as number[]).map(BigInt), data });
  checkBytesElements(tensor);
  return tensor;
}

/** The requested outputs' names, and the class counts asked of them ({"parameters": {"class_count": N}}). */
function requestedOutputsFromJson(outputs: unknown): { outputNames: string[]; outputClassCounts: Record<string, number> } {
  if (outputs === undefined || outputs === null) return { outputNames: [], outputClassCounts: {} };
  if (!Array.isArray(outputs)) throw RpcError.invalidArgument('"outputs" must be an array of {"name": ...}');
  const requested = outputs.map((output: unknown, i) => {
    if (!isObject(output) || typeof output['name'] !== 'string' || output['name'] === '') {
      throw RpcError.invalidArgument(`outputs[${i}] needs a "name" string`);
    }
    const name = output['name'];
    return { name, parameters: parametersFromJson(`output "${name}"`, output['parameters']) };
  });
  return { outputNames: requested.map((output) => output.name), outputClassCounts: outputClassCounts(requested) };
}

/** The internal response as a KServe v2 REST response; parameters say whether it was cached or degraded. */
export function inferResponseToJson(response: InferenceResponse): JsonInferResponse {
  const out: JsonInferResponse = {
    model_name: response.modelName,
    model_version: response.modelVersion,
    parameters: { ...parametersToJson(response.parameters), cached: response.cached, degraded: response.degraded },
    outputs: response.outputs.map((tensor) => {
      let data: unknown[];
      try {
        data = rawToJson(tensor.datatype, tensor.data);
      } catch (error) {
        throw new RpcError(status.INTERNAL, `output "${tensor.name}" could not be converted to JSON: ${error instanceof Error ? error.message : String(error)}`, {
          reason: 'INTERNAL',
        });
      }
      return { name: tensor.name, datatype: datatypeName(tensor.datatype), shape: tensor.shape.map(Number), data };
    }),
  };
  if (response.id !== '') out.id = response.id;
  return out;
}
