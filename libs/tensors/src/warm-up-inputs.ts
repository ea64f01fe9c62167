import { create } from '@bufbuild/protobuf';
import { type Tensor, type TensorSpec, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { WarmUp, WarmUpInput, WarmUpSample } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { decodeBytesElements, encodeBytesElements } from './bytes-elements';
import { DataType, datatypeInfo } from './datatypes';
import { jsonToRaw } from './json-data';
import { elementCount } from './shape';

/**
 * The most elements a tensor of a warm-up run may have once a sample is repeated to a warm-up batch
 * size (the registry's limit for one given tensor); a batch size that would pass it is not run for
 * that sample, so that repetition cannot multiply a warm-up's memory.
 */
export const MAX_WARM_UP_RUN_ELEMENTS = 16_777_216;

/** One warm-up run: what it is called in messages, and its inputs, made when it runs. */
export interface WarmUpRun {
  readonly label: string;
  inputs(): Tensor[];
}

/** The runs that warm a version up, and whether they were given at registration (else synthetic). */
export interface WarmUpPlan {
  readonly given: boolean;
  readonly runs: readonly WarmUpRun[];
}

/**
 * The warm-up runs of a version. With a warm-up given at registration: each sample in order, as given,
 * and for a model that batches (maxBatchSize > 0) also repeated along the first dimension to each of
 * the warm-up batch sizes it does not already have (within MAX_WARM_UP_RUN_ELEMENTS per tensor). Without: synthetic inputs at each warm-up batch
 * size (see warmUpInputs).
 */
export function warmUpPlan(
  warmUp: WarmUp | undefined,
  specs: readonly TensorSpec[],
  maxBatchSize: number,
  configuredBatchSizes: readonly (number | 'max')[],
): WarmUpPlan {
  const batchSizes = warmUpBatchSizes(configuredBatchSizes, maxBatchSize);
  if (warmUp === undefined || warmUp.samples.length === 0) {
    return {
      given: false,
      runs: batchSizes.map((batch) => ({
        label: `synthetic warm-up at batch ${batch}`,
        inputs: () => warmUpInputs(specs, batch),
      })),
    };
  }
  const runs: WarmUpRun[] = [];
  warmUp.samples.forEach((sample, index) => {
    const label = `warm-up sample ${sample.name === '' ? String(index + 1) : `"${sample.name}"`}`;
    const inputs = () => sampleInputs(sample, index, specs);
    runs.push({ label, inputs });
    if (maxBatchSize <= 0) return;
    const own = Number(sample.inputs[0]?.shape[0] ?? 1n);
    const largestItem = Math.max(0, ...sample.inputs.map((input) => elementCount(input.shape) / Math.max(own, 1)));
    for (const batch of batchSizes) {
      if (batch === own || batch * largestItem > MAX_WARM_UP_RUN_ELEMENTS) continue;
      runs.push({ label: `${label} at batch ${batch}`, inputs: () => inputs().map((t) => repeatItems(t, batch)) });
    }
  });
  return { given: true, runs };
}

/**
 * The inputs of the sample at `index` of a warm-up (or a calibration set) as tensors: its data,
 * zeros, or random values seeded by the sample's index and the input's position, so the same sample
 * gives the same values wherever it runs. A datatype left unspecified is the signature's.
 */
export function sampleInputs(sample: WarmUpSample, index: number, specs: readonly TensorSpec[]): Tensor[] {
  const datatypes = new Map(specs.map((spec) => [spec.name, spec.datatype]));
  const datatypeOf = (input: WarmUpInput) =>
    input.datatype !== DataType.UNSPECIFIED ? input.datatype : (datatypes.get(input.name) ?? DataType.UNSPECIFIED);
  return sample.inputs.map((input, i) => sampleTensor(input, datatypeOf(input), (index + 1) * 1_000 + i));
}

/**
 * Synthetic inputs for a warm-up run: one of each declared input, a dynamic first dimension set to
 * `batch`, every other dynamic dimension 1, zeros for numbers and empty strings for BYTES.
 */
export function warmUpInputs(specs: readonly TensorSpec[], batch = 1): Tensor[] {
  return specs.map((spec) => {
    const shape = spec.shape.map((d, i) => (d >= 0n ? d : i === 0 ? BigInt(batch) : 1n));
    return create(TensorSchema, {
      name: spec.name,
      datatype: spec.datatype,
      shape,
      data: zeros(spec.datatype, elementCount(shape)),
    });
  });
}

/**
 * The batch sizes to warm a version up at: the configured ones, "max" meaning its maximum batch size,
 * each at most once; just 1 for a model that does not batch (maxBatchSize 0).
 */
export function warmUpBatchSizes(configured: readonly (number | 'max')[], maxBatchSize: number): number[] {
  if (maxBatchSize <= 0) return [1];
  const sizes = configured.map((s) => Math.min(s === 'max' ? maxBatchSize : s, maxBatchSize));
  return [...new Set(sizes)].sort((a, b) => a - b);
}

/** A sample's input as a tensor: its data, zeros, or random values from a generator seeded with `seed`. */
function sampleTensor(input: WarmUpInput, datatype: DataType, seed: number): Tensor {
  const count = elementCount(input.shape);
  const { contents } = input;
  const data =
    contents.case === 'data'
      ? contents.value
      : contents.case === 'randomData'
        ? randomData(input.name, datatype, count, seed)
        : zeros(datatype, count);
  return create(TensorSchema, { name: input.name, datatype, shape: input.shape, data });
}

function zeros(datatype: DataType, count: number): Uint8Array {
  return datatype === DataType.BYTES
    ? encodeBytesElements(Array.from({ length: count }, () => new Uint8Array(0)))
    : new Uint8Array(count * datatypeInfo(datatype).byteSize);
}

const LETTERS = 'abcdefghijklmnopqrstuvwxyz';
const FLOATING = new Set([DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16]);

/**
 * Random values, the same for the same seed: uniform in [0, 1) for floating-point datatypes, whole
 * numbers from 0 to 127 for integers (which every integer datatype holds), random booleans, and 8
 * random letters for BYTES. Written by the KServe JSON decoder, so each datatype is encoded in one place.
 */
function randomData(name: string, datatype: DataType, count: number, seed: number): Uint8Array {
  const next = mulberry32(seed);
  const values: unknown[] = new Array(count);
  for (let i = 0; i < count; i++) {
    if (datatype === DataType.BOOL) values[i] = next() < 0.5;
    else if (datatype === DataType.BYTES)
      values[i] = Array.from({ length: 8 }, () => LETTERS[Math.floor(next() * LETTERS.length)]).join('');
    else if (FLOATING.has(datatype)) values[i] = next();
    else values[i] = Math.floor(next() * 128);
  }
  return jsonToRaw(name, datatype, values, count);
}

/** A small seeded generator of numbers in [0, 1) (mulberry32): the same seed, the same values. */
function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The tensor with `batch` items along its first dimension: its own items repeated in turn. */
function repeatItems(tensor: Tensor, batch: number): Tensor {
  const items = Number(tensor.shape[0] ?? 1n);
  const shape = [BigInt(batch), ...tensor.shape.slice(1)];
  if (items <= 0) return create(TensorSchema, { ...tensor, shape });
  let data: Uint8Array;
  if (tensor.datatype === DataType.BYTES) {
    const elements = decodeBytesElements(tensor.data) ?? [];
    const perItem = elements.length / items;
    data = encodeBytesElements(
      Array.from(
        { length: batch * perItem },
        (_, i) => elements[(Math.floor(i / perItem) % items) * perItem + (i % perItem)]!,
      ),
    );
  } else {
    const itemBytes = tensor.data.byteLength / items;
    data = new Uint8Array(batch * itemBytes);
    for (let i = 0; i < batch; i++)
      data.set(tensor.data.subarray((i % items) * itemBytes, ((i % items) + 1) * itemBytes), i * itemBytes);
  }
  return create(TensorSchema, { ...tensor, shape, data });
}
