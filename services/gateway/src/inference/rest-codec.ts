import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  type Tensor,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { InferParameter } from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  checkData,
  DataType,
  datatypeInfo,
  datatypeName,
  formatShape,
  jsonToRaw,
  quoted,
  rawToJson,
  TensorDataError,
} from '@infermesh/tensors';
import { type JsonParameter, outputClassCounts, parametersFromJson, parametersToJson } from './infer-parameters';
import {
  checkInputCount,
  checkName,
  checkParameterKeys,
  checkTensorSize,
  DEFAULT_TENSOR_LIMITS,
  type TensorLimits,
} from './tensor-limits';
import { checkBytesElements, tensorDatatype, tensorElementCount } from './tensor-shape';

/** A KServe v2 REST inference response. */
export interface JsonInferResponse {
  model_name: string;
  model_version: string;
  id?: string;
  parameters: Record<string, JsonParameter>;
  outputs: JsonOutputTensor[];
}

/** An output with its data as JSON, or (binary tensor data extension) only the size of its bytes after the JSON. */
export type JsonOutputTensor =
  | { name: string; datatype: string; shape: number[]; data: unknown[] }
  | { name: string; datatype: string; shape: number[]; parameters: { binary_data_size: number } };

export interface RestDecodeOptions {
  /** What one request may hold; the generous defaults when not given. */
  limits?: TensorLimits;
  /** The bytes after the JSON header of a request with Inference-Header-Content-Length. */
  binaryData?: Uint8Array | undefined;
}

/**
 * Which outputs go back as binary data (Triton's binary tensor data extension): a requested output's
 * `binary_data` parameter, else the request's `binary_data_output` parameter, else none.
 */
export interface BinaryOutputs {
  readonly all: boolean;
  readonly byName: ReadonlyMap<string, boolean>;
}

export interface RestInferRequest {
  request: InferenceRequest;
  binaryOutputs: BinaryOutputs;
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

const invalidTensor = (message: string) => Errors.invalidTensor(message);

/** The binary data after the JSON header, consumed input by input in the order of "inputs". */
interface BinaryReader {
  readonly data: Uint8Array;
  offset: number;
  readonly inputs: string[];
}

/**
 * A KServe v2 REST inference request body as the internal request: each input's data (flat or
 * nested, row-major) becomes raw little-endian bytes, checked against its datatype and shape. With
 * the binary tensor data extension, an input with a `binary_data_size` parameter takes that many of
 * the bytes after the JSON header instead, as they are: they are already the raw layout.
 */
export function restInferRequest(
  model: string,
  version: string,
  body: unknown,
  options: RestDecodeOptions = {},
): RestInferRequest {
  const limits = options.limits ?? DEFAULT_TENSOR_LIMITS;
  if (!isObject(body)) throw Errors.invalidRequest('the request body must be a JSON object with "inputs"');
  if (body['id'] !== undefined && typeof body['id'] !== 'string') throw Errors.invalidRequest('"id" must be a string');
  checkName('model name', model, limits);
  checkName('model version', version, limits);
  checkName('the request id', body['id'] ?? '', limits);
  checkParameterKeys('the request', body['parameters'], limits);
  const rawInputs = body['inputs'];
  if (!Array.isArray(rawInputs) || rawInputs.length === 0) {
    throw Errors.invalidRequest('"inputs" must be a non-empty array of tensors');
  }
  checkInputCount(rawInputs.length, limits);
  const binary: BinaryReader | undefined =
    options.binaryData === undefined ? undefined : { data: options.binaryData, offset: 0, inputs: [] };
  const seen = new Set<string>();
  const inputs = rawInputs.map((input: unknown, i) => {
    const tensor = inputFromJson(input, i, limits, binary);
    if (seen.has(tensor.name)) throw invalidTensor(`input "${tensor.name}" is given more than once`);
    seen.add(tensor.name);
    return tensor;
  });
  if (binary !== undefined && binary.offset !== binary.data.byteLength) {
    const which =
      binary.inputs.length === 0
        ? 'no input has a binary_data_size parameter'
        : `the binary_data_size parameters of ${binary.inputs.map((n) => `input "${n}"`).join(', ')} add up to ${binary.offset}`;
    throw invalidTensor(
      `the body has ${binary.data.byteLength} bytes of binary tensor data after its JSON header, but ${which}`,
    );
  }
  const parameters = parametersFromJson('the request', body['parameters']);
  const outputs = requestedOutputsFromJson(body['outputs'], limits);
  return {
    request: create(InferenceRequestSchema, {
      modelName: model,
      modelVersion: version,
      id: body['id'] ?? '',
      inputs,
      outputNames: outputs.outputNames,
      outputClassCounts: outputs.outputClassCounts,
      parameters,
    }),
    binaryOutputs: {
      all: booleanParameter('the request', 'binary_data_output', parameters) ?? false,
      byName: outputs.binary,
    },
  };
}

/** The internal request of a REST body (restInferRequest without the choice of binary outputs). */
export function inferRequestFromJson(
  model: string,
  version: string,
  body: unknown,
  options: RestDecodeOptions = {},
): InferenceRequest {
  return restInferRequest(model, version, body, options).request;
}

function inputFromJson(input: unknown, index: number, limits: TensorLimits, binary: BinaryReader | undefined): Tensor {
  if (!isObject(input)) throw invalidTensor(`inputs[${index}] must be an object`);
  const name = input['name'];
  if (typeof name !== 'string' || name === '') {
    throw invalidTensor(`inputs[${index}] needs a "name" string`);
  }
  checkName('input name', name, limits);
  checkParameterKeys(`input ${quoted(name)}`, input['parameters'], limits);
  const parameters = parametersFromJson(`input ${quoted(name)}`, input['parameters']);
  if ('shared_memory_region' in parameters) {
    throw invalidTensor(`input "${name}": shared memory is not supported; send "data"`);
  }
  const shape = input['shape'];
  if (!Array.isArray(shape) || shape.some((d) => typeof d !== 'number')) {
    throw invalidTensor(`input "${name}" needs a "shape" array of integers`);
  }
  const count = tensorElementCount(name, shape as number[]);
  const datatype = tensorDatatype(name, input['datatype']);
  checkTensorSize(name, shape as number[], count, limits);
  const binaryDataSize = parameters['binary_data_size'];
  if (binaryDataSize !== undefined)
    return binaryInput(name, datatype, shape as number[], binaryDataSize, input['data'], binary);
  if (input['data'] === undefined) throw invalidTensor(`input "${name}" has no "data"`);
  let data: Buffer;
  try {
    data = jsonToRaw(name, datatype, input['data'], count);
  } catch (error) {
    if (error instanceof TensorDataError) throw invalidTensor(error.message);
    throw error;
  }
  const tensor = create(TensorSchema, { name, datatype, shape: (shape as number[]).map(BigInt), data });
  checkBytesElements(tensor);
  return tensor;
}

/** An input whose data is the next `binary_data_size` bytes of the binary data, checked against its shape and datatype. */
function binaryInput(
  name: string,
  datatype: DataType,
  shape: number[],
  size: InferParameter,
  data: unknown,
  binary: BinaryReader | undefined,
): Tensor {
  if (data !== undefined)
    throw invalidTensor(`input "${name}" has both "data" and a binary_data_size parameter; give one of them`);
  if (binary === undefined) {
    throw invalidTensor(
      `input "${name}" has a binary_data_size parameter, but the request has no Inference-Header-Content-Length header to say where its JSON ends`,
    );
  }
  const byteLength = size.parameterChoice.case === 'int64Param' ? Number(size.parameterChoice.value) : NaN;
  if (!(byteLength >= 0))
    throw invalidTensor(`input "${name}": parameter "binary_data_size" must be a non-negative integer of bytes`);
  const left = binary.data.byteLength - binary.offset;
  if (byteLength > left) {
    throw invalidTensor(
      `input "${name}": binary_data_size is ${byteLength} but only ${left} bytes of binary data are left in the body for it`,
    );
  }
  const bytes = binary.data.subarray(binary.offset, binary.offset + byteLength);
  binary.offset += byteLength;
  binary.inputs.push(name);
  const tensor = create(TensorSchema, { name, datatype, shape: shape.map(BigInt), data: bytes });
  const problem = checkData(tensor);
  if (problem !== undefined) {
    if (datatype === DataType.BYTES) throw invalidTensor(`${problem} (binary_data_size ${byteLength})`);
    const needed = tensorElementCount(name, shape) * datatypeInfo(datatype).byteSize;
    throw invalidTensor(
      `input "${name}": binary_data_size is ${byteLength} but shape ${formatShape(shape)} of ${datatypeName(datatype)} needs ${needed} bytes`,
    );
  }
  checkBytesElements(tensor);
  return tensor;
}

/** The requested outputs' names, the class counts asked of them ({"parameters": {"class_count": N}}) and which want binary data. */
function requestedOutputsFromJson(
  outputs: unknown,
  limits: TensorLimits,
): { outputNames: string[]; outputClassCounts: Record<string, number>; binary: Map<string, boolean> } {
  const binary = new Map<string, boolean>();
  if (outputs === undefined || outputs === null) return { outputNames: [], outputClassCounts: {}, binary };
  if (!Array.isArray(outputs)) throw Errors.invalidRequest('"outputs" must be an array of {"name": ...}');
  const requested = outputs.map((output: unknown, i) => {
    if (!isObject(output) || typeof output['name'] !== 'string' || output['name'] === '') {
      throw Errors.invalidRequest(`outputs[${i}] needs a "name" string`);
    }
    const name = output['name'];
    checkName('output name', name, limits);
    checkParameterKeys(`output ${quoted(name)}`, output['parameters'], limits);
    const parameters = parametersFromJson(`output ${quoted(name)}`, output['parameters']);
    const binaryData = booleanParameter(`output "${name}"`, 'binary_data', parameters);
    if (binaryData !== undefined) binary.set(name, binaryData);
    return { name, parameters };
  });
  return {
    outputNames: requested.map((output) => output.name),
    outputClassCounts: outputClassCounts(requested),
    binary,
  };
}

/** A boolean parameter's value, undefined when absent; INVALID_ARGUMENT naming it when it is not a boolean. */
function booleanParameter(
  where: string,
  key: string,
  parameters: Readonly<Record<string, InferParameter>>,
): boolean | undefined {
  const parameter = parameters[key];
  if (parameter === undefined) return undefined;
  if (parameter.parameterChoice.case !== 'boolParam')
    throw Errors.invalidRequest(`${where}: parameter "${key}" must be a boolean`);
  return parameter.parameterChoice.value;
}

/** The internal response as a KServe v2 REST response; parameters say whether it was cached or degraded. */
export function inferResponseToJson(response: InferenceResponse): JsonInferResponse {
  return jsonResponse(response, () => false);
}

/** A REST response with the binary tensor data extension: the JSON header, then the binary outputs' bytes. */
export interface BinaryInferResponse {
  /** The JSON header's length in bytes: the response's Inference-Header-Content-Length. */
  headerLength: number;
  /** The JSON header, then each binary output's raw bytes, in the order of the header's outputs. */
  chunks: Uint8Array[];
  byteLength: number;
}

/**
 * The internal response with the outputs `binaryOutputs` names as raw bytes after the JSON header
 * (`"parameters": {"binary_data_size": n}` in place of `data`); undefined when it names none, so that
 * the response is plain JSON.
 */
export function inferResponseToBinary(
  response: InferenceResponse,
  binaryOutputs: BinaryOutputs,
): BinaryInferResponse | undefined {
  if (!binaryOutputs.all && binaryOutputs.byName.size === 0) return undefined; // the JSON path, at no cost
  const isBinary = (name: string) => binaryOutputs.byName.get(name) ?? binaryOutputs.all;
  const binary = response.outputs.filter((tensor) => isBinary(tensor.name));
  if (binary.length === 0) return undefined;
  const header = Buffer.from(JSON.stringify(jsonResponse(response, isBinary)), 'utf8');
  const chunks: Uint8Array[] = [header, ...binary.map((tensor) => tensor.data)];
  return {
    headerLength: header.byteLength,
    chunks,
    byteLength: chunks.reduce((sum, chunk) => sum + chunk.byteLength, 0),
  };
}

function jsonResponse(response: InferenceResponse, isBinary: (name: string) => boolean): JsonInferResponse {
  const out: JsonInferResponse = {
    model_name: response.modelName,
    model_version: response.modelVersion,
    parameters: { ...parametersToJson(response.parameters), cached: response.cached, degraded: response.degraded },
    outputs: response.outputs.map((tensor) => {
      const metadata = { name: tensor.name, datatype: datatypeName(tensor.datatype), shape: tensor.shape.map(Number) };
      if (isBinary(tensor.name)) return { ...metadata, parameters: { binary_data_size: tensor.data.byteLength } };
      let data: unknown[];
      try {
        data = rawToJson(tensor.datatype, tensor.data);
      } catch (error) {
        throw Errors.internal(
          `output "${tensor.name}" could not be converted to JSON: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
      return { ...metadata, data };
    }),
  };
  if (response.id !== '') out.id = response.id;
  return out;
}
