import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  type InferTensorContents,
  InferTensorContentsSchema,
  type ModelInferRequest,
  type ModelInferRequest_InferInputTensor,
  type ModelInferResponseSchema,
} from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  type Tensor,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { checkData, datatypeName, encodeBytesElements, quoted } from '@infermesh/tensors';
import { boolParameter, outputClassCounts } from './infer-parameters';
import {
  checkInputCount,
  checkName,
  checkParameterKeys,
  checkTensorSize,
  DEFAULT_TENSOR_LIMITS,
  type TensorLimits,
} from './tensor-limits';
import { checkBytesElements, tensorDatatype, tensorElementCount } from './tensor-shape';

type ContentsField = Exclude<keyof InferTensorContents, '$typeName' | '$unknown'>;

/** Which InferTensorContents field carries each datatype; FP16 (and BF16) have none and travel only raw. */
const CONTENTS_FIELD: Partial<Record<DataType, ContentsField>> = {
  [DataType.BOOL]: 'boolContents',
  [DataType.INT8]: 'intContents',
  [DataType.INT16]: 'intContents',
  [DataType.INT32]: 'intContents',
  [DataType.INT64]: 'int64Contents',
  [DataType.UINT8]: 'uintContents',
  [DataType.UINT16]: 'uintContents',
  [DataType.UINT32]: 'uintContents',
  [DataType.UINT64]: 'uint64Contents',
  [DataType.FP32]: 'fp32Contents',
  [DataType.FP64]: 'fp64Contents',
  [DataType.BYTES]: 'bytesContents',
};

const FIELD_NAME: Record<ContentsField, string> = {
  boolContents: 'bool_contents',
  intContents: 'int_contents',
  int64Contents: 'int64_contents',
  uintContents: 'uint_contents',
  uint64Contents: 'uint64_contents',
  fp32Contents: 'fp32_contents',
  fp64Contents: 'fp64_contents',
  bytesContents: 'bytes_contents',
};

const INT_RANGES: Partial<Record<DataType, [number, number]>> = {
  [DataType.INT8]: [-0x80, 0x7f],
  [DataType.INT16]: [-0x8000, 0x7fff],
  [DataType.UINT8]: [0, 0xff],
  [DataType.UINT16]: [0, 0xffff],
};

const invalid = (message: string) => Errors.invalidTensor(message);

/**
 * A KServe v2 gRPC ModelInfer request as the internal request. Inputs come either all in
 * raw_input_contents (one entry per input, in order) or all as typed contents; either way they leave
 * as raw little-endian bytes whose length agrees with the shape. `limits` bound the inputs and each
 * tensor's size before any is converted.
 */
export function inferRequestFromGrpc(
  request: ModelInferRequest,
  limits: TensorLimits = DEFAULT_TENSOR_LIMITS,
): InferenceRequest {
  if (request.modelName === '') throw Errors.invalidRequest('model_name is required');
  if (request.inputs.length === 0) throw Errors.invalidRequest('the request has no inputs');
  checkInputCount(request.inputs.length, limits);
  checkGrpcNames(request, limits);
  const raw = request.rawInputContents;
  if (raw.length > 0 && raw.length !== request.inputs.length) {
    throw invalid(
      `raw_input_contents has ${raw.length} entries but the request has ${request.inputs.length} inputs; give one per input, in order`,
    );
  }
  const seen = new Set<string>();
  const inputs = request.inputs.map((input, i) => {
    if (input.name === '') throw invalid(`inputs[${i}] has no name`);
    if (seen.has(input.name)) throw invalid(`input "${input.name}" is given more than once`);
    seen.add(input.name);
    if ('shared_memory_region' in input.parameters)
      throw invalid(`input "${input.name}": shared memory is not supported`);
    return raw.length > 0 ? rawInput(input, raw[i]!, limits) : typedInput(input, limits);
  });
  return create(InferenceRequestSchema, {
    modelName: request.modelName,
    modelVersion: request.modelVersion,
    id: request.id,
    inputs,
    outputNames: request.outputs.map((output) => output.name),
    outputClassCounts: outputClassCounts(request.outputs),
    parameters: request.parameters,
  });
}

/** Every name the request gives within GATEWAY_MAX_NAME_BYTES, before any is used. */
function checkGrpcNames(request: ModelInferRequest, limits: TensorLimits): void {
  checkName('model name', request.modelName, limits);
  checkName('model version', request.modelVersion, limits);
  checkName('the request id', request.id, limits);
  checkParameterKeys('the request', request.parameters, limits);
  for (const input of request.inputs) {
    checkName('input name', input.name, limits);
    checkParameterKeys(`input ${quoted(input.name)}`, input.parameters, limits);
  }
  for (const output of request.outputs) {
    checkName('output name', output.name, limits);
    checkParameterKeys(`output ${quoted(output.name)}`, output.parameters, limits);
  }
}

function rawInput(input: ModelInferRequest_InferInputTensor, data: Uint8Array, limits: TensorLimits): Tensor {
  const datatype = tensorDatatype(input.name, input.datatype);
  checkTensorSize(input.name, input.shape, tensorElementCount(input.name, input.shape), limits);
  if (input.contents !== undefined && usedFields(input.contents).length > 0) {
    throw invalid(
      `input "${input.name}" has typed contents, but raw_input_contents is used: then every input must be raw`,
    );
  }
  const tensor = create(TensorSchema, { name: input.name, datatype, shape: input.shape, data });
  const problem = checkData(tensor);
  if (problem !== undefined) throw invalid(problem);
  checkBytesElements(tensor);
  return tensor;
}

function typedInput(input: ModelInferRequest_InferInputTensor, limits: TensorLimits): Tensor {
  const { name } = input;
  const datatype = tensorDatatype(name, input.datatype);
  const count = tensorElementCount(name, input.shape);
  checkTensorSize(name, input.shape, count, limits);
  const field = CONTENTS_FIELD[datatype];
  const contents = input.contents ?? create(InferTensorContentsSchema);
  const used = usedFields(contents);
  if (field === undefined) {
    // A tensor without elements carries no data, so it needs no contents field.
    if (count === 0 && used.length === 0) return create(TensorSchema, { name, datatype, shape: input.shape });
    throw invalid(
      `input "${name}": ${datatypeName(datatype)} has no typed contents field in KServe v2; send the request's inputs in raw_input_contents (${datatypeName(datatype)} as little-endian IEEE 754 half-precision)`,
    );
  }
  const wrong = used.find((f) => f !== field);
  if (wrong !== undefined) {
    throw invalid(
      `input "${name}" has datatype ${datatypeName(datatype)}, whose data goes in ${FIELD_NAME[field]}, but ${FIELD_NAME[wrong]} is set`,
    );
  }
  const values: readonly unknown[] = contents[field];
  if (values.length !== count) {
    throw invalid(
      `input "${name}": ${FIELD_NAME[field]} has ${values.length} elements but shape [${input.shape.join(',')}] needs ${count}`,
    );
  }
  const tensor = create(TensorSchema, {
    name,
    datatype,
    shape: input.shape,
    data: typedToRaw(name, datatype, contents),
  });
  checkBytesElements(tensor);
  return tensor;
}

function usedFields(contents: InferTensorContents): ContentsField[] {
  return (Object.keys(FIELD_NAME) as ContentsField[]).filter((field) => contents[field].length > 0);
}

/** Typed contents as raw little-endian bytes (typed arrays share the host's order: little-endian on every supported platform). */
function typedToRaw(name: string, datatype: DataType, contents: InferTensorContents): Uint8Array {
  const bytes = (view: ArrayBufferView) => new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  const checked = (values: number[]) => {
    const range = INT_RANGES[datatype];
    if (range !== undefined) {
      const i = values.findIndex((v) => v < range[0] || v > range[1]);
      if (i >= 0)
        throw invalid(
          `input "${name}": element ${i} (${values[i]}) is not in the ${datatypeName(datatype)} range [${range[0]}, ${range[1]}]`,
        );
    }
    return values;
  };
  switch (datatype) {
    case DataType.BOOL:
      return Uint8Array.from(contents.boolContents, (v) => (v ? 1 : 0));
    case DataType.INT8:
      return bytes(Int8Array.from(checked(contents.intContents)));
    case DataType.INT16:
      return bytes(Int16Array.from(checked(contents.intContents)));
    case DataType.INT32:
      return bytes(Int32Array.from(contents.intContents));
    case DataType.INT64:
      return bytes(BigInt64Array.from(contents.int64Contents));
    case DataType.UINT8:
      return Uint8Array.from(checked(contents.uintContents));
    case DataType.UINT16:
      return bytes(Uint16Array.from(checked(contents.uintContents)));
    case DataType.UINT32:
      return bytes(Uint32Array.from(contents.uintContents));
    case DataType.UINT64:
      return bytes(BigUint64Array.from(contents.uint64Contents));
    case DataType.FP32:
      return bytes(Float32Array.from(contents.fp32Contents));
    case DataType.FP64:
      return bytes(Float64Array.from(contents.fp64Contents));
    case DataType.BYTES:
      return encodeBytesElements(contents.bytesContents);
    default:
      throw invalid(`input "${name}": ${datatypeName(datatype)} data must be sent in raw_input_contents`);
  }
}

/**
 * The internal response as a ModelInfer response: raw_output_contents (the Triton default) with the
 * outputs' metadata; parameters say whether it was cached or degraded.
 */
export function inferResponseToGrpc(response: InferenceResponse): MessageInitShape<typeof ModelInferResponseSchema> {
  return {
    modelName: response.modelName,
    modelVersion: response.modelVersion,
    id: response.id,
    parameters: {
      ...response.parameters,
      cached: boolParameter(response.cached),
      degraded: boolParameter(response.degraded),
    },
    outputs: response.outputs.map((tensor) => ({
      name: tensor.name,
      datatype: datatypeName(tensor.datatype),
      shape: tensor.shape,
    })),
    rawOutputContents: response.outputs.map((tensor) => tensor.data),
  };
}
