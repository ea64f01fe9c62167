import { create, equals } from '@bufbuild/protobuf';
import { Errors, type RpcError } from '@infermesh/grpc';
import { DataType, type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Signature,
  type WarmUp,
  type WarmUpInput,
  WarmUpSchema,
  type WarmUpSample,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  checkData,
  datatypeName,
  decodeBytesElements,
  elementCount,
  formatShape,
  shapeMatches,
  unservableBytesElement,
  UNSERVED_DATATYPES,
} from '@infermesh/tensors';

/** The most samples a version's warm-up may hold. */
export const MAX_WARM_UP_SAMPLES = 16;
/** The most bytes of data (WarmUpInput.data) a version's warm-up may hold in all: it travels with the version to every follower. */
export const MAX_WARM_UP_DATA_BYTES = 1024 * 1024;
/** The most elements of one warm-up tensor, given or generated. */
export const MAX_WARM_UP_TENSOR_ELEMENTS = 16_777_216;
/** The longest name of a warm-up sample. */
export const MAX_WARM_UP_SAMPLE_NAME_CHARS = 64;

type Refusal = (message: string) => RpcError;
const quoted = (names: Iterable<string>) => [...names].map((n) => `"${n}"`).join(', ');

/**
 * Checks a version's warm-up (or samples in its form, named `field` in messages, such as a
 * calibration set) against its signature and returns what to store, each input's datatype filled in
 * from the signature: undefined when it holds no sample. Refuses with INVALID_ARGUMENT, naming the
 * sample and the input: more than MAX_WARM_UP_SAMPLES samples or
 * MAX_WARM_UP_DATA_BYTES of data, a sample name over MAX_WARM_UP_SAMPLE_NAME_CHARS, an input the model
 * does not have, given twice or missing, a datatype other than the signature's, a shape that is not
 * concrete or does not fit the signature, a batch size out of 1 to the max batch size or different
 * between a sample's inputs (for a model that batches), more than MAX_WARM_UP_TENSOR_ELEMENTS
 * elements, no contents, and data whose length does not agree with the shape.
 */
export function checkWarmUp(warmUp: WarmUp | undefined, signature: Signature, field = 'warm_up'): WarmUp | undefined {
  if (warmUp === undefined || warmUp.samples.length === 0) return undefined;
  const invalid: Refusal = (message) => Errors.invalidRequest(`${field}: ${message}`);
  if (warmUp.samples.length > MAX_WARM_UP_SAMPLES) {
    throw invalid(
      `${warmUp.samples.length} samples are given, above the limit of ${MAX_WARM_UP_SAMPLES} (MAX_WARM_UP_SAMPLES)`,
    );
  }
  let dataBytes = 0;
  for (const sample of warmUp.samples)
    for (const input of sample.inputs) if (input.contents.case === 'data') dataBytes += input.contents.value.byteLength;
  if (dataBytes > MAX_WARM_UP_DATA_BYTES) {
    throw invalid(
      `the samples hold ${dataBytes} bytes of data, above the limit of ${MAX_WARM_UP_DATA_BYTES} (1 MiB, MAX_WARM_UP_DATA_BYTES); give large inputs as zero_data or random_data`,
    );
  }
  return create(WarmUpSchema, {
    samples: warmUp.samples.map((sample, i) => checkSample(sample, i, signature, invalid)),
  });
}

/** True when two warm-ups declare the same thing once checked against `signature`; unset and empty are the same. */
export function sameWarmUp(stored: WarmUp | undefined, requested: WarmUp | undefined, signature: Signature): boolean {
  return equals(
    WarmUpSchema,
    stored ?? create(WarmUpSchema),
    checkWarmUp(requested, signature) ?? create(WarmUpSchema),
  );
}

/** How a sample is named in messages: warm_up.samples[0] ("16 kHz"). */
export function sampleLabel(sample: WarmUpSample, index: number): string {
  return `samples[${index}]${sample.name === '' ? '' : ` ("${sample.name}")`}`;
}

function checkSample(sample: WarmUpSample, index: number, signature: Signature, invalid: Refusal): WarmUpSample {
  const label = sampleLabel(sample, index);
  if (sample.name.length > MAX_WARM_UP_SAMPLE_NAME_CHARS) {
    throw invalid(
      `samples[${index}]: the name has ${sample.name.length} characters, above the limit of ${MAX_WARM_UP_SAMPLE_NAME_CHARS}`,
    );
  }
  const specs = new Map(signature.inputs.map((spec) => [spec.name, spec]));
  const seen = new Set<string>();
  let batch: bigint | undefined;
  const inputs = sample.inputs.map((input) => {
    const spec = specs.get(input.name);
    const where = `${label} input "${input.name}"`;
    if (spec === undefined)
      throw invalid(`${label}: the model has no input "${input.name}"; its inputs are ${quoted(specs.keys())}`);
    if (seen.has(input.name)) throw invalid(`${where} is given more than once`);
    seen.add(input.name);
    if (input.datatype !== DataType.UNSPECIFIED && input.datatype !== spec.datatype) {
      throw invalid(
        `${where} has datatype ${datatypeName(input.datatype)} but the model expects ${datatypeName(spec.datatype)}`,
      );
    }
    if (UNSERVED_DATATYPES.has(spec.datatype))
      throw invalid(`${where} is ${datatypeName(spec.datatype)}, which onnxruntime-node cannot hold`);
    if (input.shape.some((d) => d < 0n) || !shapeMatches(spec.shape, input.shape)) {
      throw invalid(
        `${where} has shape ${formatShape(input.shape)} but the model expects ${formatShape(spec.shape)}; give a concrete size (0 or more) for each -1`,
      );
    }
    if (signature.maxBatchSize > 0) {
      const size = input.shape[0]!;
      if (size < 1n || size > BigInt(signature.maxBatchSize)) {
        throw invalid(
          `${where} has batch size ${size}; the model batches 1 to ${signature.maxBatchSize} items along its first dimension`,
        );
      }
      if (batch !== undefined && size !== batch)
        throw invalid(`${where} has batch size ${size} but another input of the sample has ${batch}`);
      batch = size;
    }
    const elements = elementCount(input.shape);
    if (elements > MAX_WARM_UP_TENSOR_ELEMENTS) {
      throw invalid(
        `${where} has ${elements} elements, above the limit of ${MAX_WARM_UP_TENSOR_ELEMENTS} (MAX_WARM_UP_TENSOR_ELEMENTS)`,
      );
    }
    checkContents(input, spec.datatype, label, where, invalid);
    return { ...input, datatype: spec.datatype };
  });
  const missing = [...specs.keys()].filter((name) => !seen.has(name));
  if (missing.length > 0)
    throw invalid(`${label} gives no value for input ${quoted(missing)}; a sample gives every input`);
  return { ...sample, inputs };
}

function checkContents(input: WarmUpInput, datatype: DataType, label: string, where: string, invalid: Refusal): void {
  const { contents } = input;
  switch (contents.case) {
    case 'data': {
      const tensor: Tensor = create(TensorSchema, {
        name: input.name,
        datatype,
        shape: input.shape,
        data: contents.value,
      });
      const problem = checkData(tensor);
      // checkData's problem names the input.
      if (problem !== undefined) throw invalid(`${label} ${problem}`);
      if (datatype === DataType.BYTES) {
        const unservable = unservableBytesElement(decodeBytesElements(contents.value)!);
        if (unservable !== undefined)
          throw invalid(`${where}: BYTES element ${unservable.index} ${unservable.problem}`);
      }
      return;
    }
    case 'zeroData':
    case 'randomData':
      if (!contents.value)
        throw invalid(
          `${where}: ${contents.case === 'zeroData' ? 'zero_data' : 'random_data'} is false; give data, or zero_data or random_data true`,
        );
      return;
    case undefined:
      throw invalid(`${where} has no contents; give data, zero_data or random_data`);
  }
}
