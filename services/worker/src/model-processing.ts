import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  DataType,
  type Tensor,
  TensorSchema,
  type TensorSpec,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  datatypeInfo,
  datatypeName,
  elementCount,
  encodeBytesElements,
  formatShape,
  fromBfloat16Bits,
  fromHalfBits,
  toHalfBits,
} from '@infermesh/tensors';

/** An input's normalization, y = (x - mean[i]) / std[i], with i the position along the last dimension. */
interface Normalization {
  readonly mean: readonly number[];
  readonly std: readonly number[];
  /** 1 for scalars, else the length the last dimension must have. */
  readonly width: number;
}

/** The datatypes whose values can be ranked as class scores. */
const RANKABLE = new Set([
  DataType.UINT8,
  DataType.UINT16,
  DataType.UINT32,
  DataType.UINT64,
  DataType.INT8,
  DataType.INT16,
  DataType.INT32,
  DataType.INT64,
  DataType.FP16,
  DataType.FP32,
  DataType.FP64,
  DataType.BF16,
]);
const FLOATING = new Set([DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16]);

const invalid = (message: string, metadata: Record<string, string>) =>
  Errors.invalidTensor(message, { metadata: metadata });

/**
 * The pre- and post-processing a model version declares in the registry (ModelVersion.processing),
 * applied to raw little-endian tensors around the model, without the model runtime:
 * - preprocess: normalizes inputs, y = (x - mean) / std in double precision, rounded once to the
 *   input's datatype (FP16, FP32, FP64), with scalars or one value per position along the last
 *   dimension;
 * - postprocess: Triton's classification extension. An output asked for with class_count N becomes,
 *   for each batch item, a BYTES tensor of its N highest scores as "score:index:label" ("score:index"
 *   without a label), highest first, equal scores by lower index; shape [batch, N] for a model that
 *   batches, [N] for one that does not (every element of the output is then one class). Scores are
 *   printed as C's "%f" prints them (6 decimals) for floating-point outputs, as integers otherwise.
 * Bad requests are INVALID_ARGUMENT / INVALID_TENSOR naming the tensor. A version without processing
 * still classifies (with no labels); its inputs pass through untouched.
 */
export class ModelProcessing {
  private readonly version: string;
  private readonly batches: boolean;
  private readonly outputs: ReadonlyMap<string, TensorSpec>;
  private readonly normalizations = new Map<string, Normalization>();
  private readonly labels = new Map<string, readonly string[]>();

  constructor(version: ModelVersion) {
    this.version = version.name;
    const signature = version.signature;
    this.batches = (signature?.maxBatchSize ?? 0) > 0;
    this.outputs = new Map((signature?.outputs ?? []).map((spec) => [spec.name, spec]));
    for (const { input, mean, std } of version.processing?.inputNormalizations ?? []) {
      this.normalizations.set(input, { mean, std, width: Math.max(mean.length, std.length, 1) });
    }
    for (const { output, labels } of version.processing?.outputLabels ?? []) this.labels.set(output, labels);
  }

  /** True when preprocess changes inputs; when false it hands them back as they are. */
  get normalizesInputs(): boolean {
    return this.normalizations.size > 0;
  }

  /**
   * Checks the class counts a request asks for against the model's signature, so that a request
   * that cannot be answered is refused before the model runs: every output known and numeric, every
   * count a positive integer and no more than the output's classes where the signature fixes them.
   */
  checkClassCounts(classCounts: Readonly<Record<string, number>>): void {
    for (const [output, count] of Object.entries(classCounts)) {
      const metadata = { version: this.version, output };
      if (!Number.isInteger(count) || count < 1)
        throw invalid(`output "${output}": class_count must be a positive integer, got ${count}`, metadata);
      const spec = this.outputs.get(output);
      if (spec === undefined) {
        throw invalid(
          `class_count is asked of output "${output}", but the model has no such output; its outputs are ${[...this.outputs.keys()].map((n) => `"${n}"`).join(', ')}`,
          metadata,
        );
      }
      if (!RANKABLE.has(spec.datatype)) {
        throw invalid(
          `output "${output}" is ${datatypeName(spec.datatype)}, not numeric scores; class_count needs a numeric output`,
          metadata,
        );
      }
      const dims = this.batches ? spec.shape.slice(1) : spec.shape;
      if (dims.every((d) => d >= 0n)) this.checkCount(output, count, elementCount(dims));
    }
  }

  /** The inputs with the declared normalizations applied; new tensors, the given ones are left alone. */
  preprocess(inputs: readonly Tensor[]): Tensor[] {
    if (this.normalizations.size === 0) return [...inputs];
    return inputs.map((input) => {
      const normalization = this.normalizations.get(input.name);
      return normalization === undefined ? input : this.normalize(input, normalization);
    });
  }

  /**
   * The outputs with those named in classCounts replaced by their top classes (same name, BYTES),
   * the others as they are, in the same order. classCounts is the request's output_class_counts.
   */
  postprocess(outputs: readonly Tensor[], classCounts: Readonly<Record<string, number>>): Tensor[] {
    const asked = Object.keys(classCounts);
    if (asked.length === 0) return [...outputs];
    this.checkClassCounts(classCounts);
    const returned = new Set(outputs.map((output) => output.name));
    const missing = asked.find((name) => !returned.has(name));
    if (missing !== undefined) {
      throw invalid(`class_count is asked of output "${missing}", which the request does not return; request it too`, {
        version: this.version,
        output: missing,
      });
    }
    return outputs.map((output) => {
      const count = classCounts[output.name];
      return count === undefined ? output : this.classify(output, count);
    });
  }

  private normalize(input: Tensor, { mean, std, width }: Normalization): Tensor {
    const name = input.name;
    const metadata = { version: this.version, input: name };
    if (input.datatype !== DataType.FP16 && input.datatype !== DataType.FP32 && input.datatype !== DataType.FP64) {
      throw invalid(
        `input "${name}" is ${datatypeName(input.datatype)}, but its normalization needs FP16, FP32 or FP64`,
        metadata,
      );
    }
    const last = input.shape.length === 0 ? 1 : Number(input.shape[input.shape.length - 1]);
    if (width > 1 && last !== width) {
      throw invalid(
        `input "${name}" has shape ${formatShape(input.shape)}, but its normalization has ${width} values for its last dimension`,
        metadata,
      );
    }
    const count = elementCount(input.shape);
    const size = datatypeInfo(input.datatype).byteSize;
    if (input.data.byteLength !== count * size) {
      throw invalid(
        `input "${name}" has ${input.data.byteLength} bytes of data but shape ${formatShape(input.shape)} needs ${count * size}`,
        metadata,
      );
    }
    const source = new DataView(input.data.buffer, input.data.byteOffset, input.data.byteLength);
    const data = new Uint8Array(input.data.byteLength);
    const target = new DataView(data.buffer);
    const meanAt = (i: number) => (mean.length === 0 ? 0 : mean.length === 1 ? mean[0]! : mean[i % width]!);
    const stdAt = (i: number) => (std.length === 0 ? 1 : std.length === 1 ? std[0]! : std[i % width]!);
    for (let i = 0; i < count; i += 1) {
      switch (input.datatype) {
        case DataType.FP32:
          target.setFloat32(i * 4, (source.getFloat32(i * 4, true) - meanAt(i)) / stdAt(i), true);
          break;
        case DataType.FP64:
          target.setFloat64(i * 8, (source.getFloat64(i * 8, true) - meanAt(i)) / stdAt(i), true);
          break;
        default:
          target.setUint16(
            i * 2,
            toHalfBits((fromHalfBits(source.getUint16(i * 2, true)) - meanAt(i)) / stdAt(i)),
            true,
          );
      }
    }
    return create(TensorSchema, { name, datatype: input.datatype, shape: [...input.shape], data });
  }

  private classify(output: Tensor, count: number): Tensor {
    const name = output.name;
    const metadata = { version: this.version, output: name };
    if (!RANKABLE.has(output.datatype)) {
      throw invalid(
        `output "${name}" is ${datatypeName(output.datatype)}, not numeric scores; class_count needs a numeric output`,
        metadata,
      );
    }
    const batched = this.batches && output.shape.length > 0;
    const rows = batched ? Number(output.shape[0]) : 1;
    const perRow = elementCount(batched ? output.shape.slice(1) : output.shape);
    this.checkCount(name, count, perRow);
    const size = datatypeInfo(output.datatype).byteSize;
    if (output.data.byteLength !== rows * perRow * size) {
      throw Errors.internal(
        `output "${name}" has ${output.data.byteLength} bytes of data but shape ${formatShape(output.shape)} needs ${rows * perRow * size}`,
        { metadata },
      );
    }
    const view = new DataView(output.data.buffer, output.data.byteOffset, output.data.byteLength);
    const read = reader(output.datatype, view);
    const format = FLOATING.has(output.datatype)
      ? (v: number | bigint) => printfFixed(Number(v))
      : (v: number | bigint) => String(v);
    const labels = this.labels.get(name) ?? [];
    const elements: Buffer[] = [];
    for (let row = 0; row < rows; row += 1) {
      const values: (number | bigint)[] = new Array<number | bigint>(perRow);
      for (let i = 0; i < perRow; i += 1) values[i] = read(row * perRow + i);
      for (const index of topIndices(values, count)) {
        const label = labels[index] ?? '';
        const text = `${format(values[index]!)}:${index}${label === '' ? '' : `:${label}`}`;
        elements.push(Buffer.from(text, 'utf8'));
      }
    }
    return create(TensorSchema, {
      name,
      datatype: DataType.BYTES,
      shape: batched ? [BigInt(rows), BigInt(count)] : [BigInt(count)],
      data: encodeBytesElements(elements),
    });
  }

  private checkCount(output: string, count: number, classes: number): void {
    if (count > classes) {
      throw invalid(
        `output "${output}" has ${classes} classes per item, fewer than the ${count} class_count asks for`,
        {
          version: this.version,
          output,
          class_count: String(count),
        },
      );
    }
  }
}

/** Reads element i of a numeric tensor: a number, or a bigint for 64-bit integers. */
function reader(datatype: DataType, view: DataView): (i: number) => number | bigint {
  switch (datatype) {
    case DataType.UINT8:
      return (i) => view.getUint8(i);
    case DataType.UINT16:
      return (i) => view.getUint16(i * 2, true);
    case DataType.UINT32:
      return (i) => view.getUint32(i * 4, true);
    case DataType.UINT64:
      return (i) => view.getBigUint64(i * 8, true);
    case DataType.INT8:
      return (i) => view.getInt8(i);
    case DataType.INT16:
      return (i) => view.getInt16(i * 2, true);
    case DataType.INT32:
      return (i) => view.getInt32(i * 4, true);
    case DataType.INT64:
      return (i) => view.getBigInt64(i * 8, true);
    case DataType.FP16:
      return (i) => fromHalfBits(view.getUint16(i * 2, true));
    case DataType.BF16:
      return (i) => fromBfloat16Bits(view.getUint16(i * 2, true));
    case DataType.FP32:
      return (i) => view.getFloat32(i * 4, true);
    case DataType.FP64:
      return (i) => view.getFloat64(i * 8, true);
    default:
      throw new RangeError(`${datatypeName(datatype)} has no numeric elements`);
  }
}

/** The indices of the count highest values, highest first; equal values by lower index, NaN last. */
function topIndices(values: readonly (number | bigint)[], count: number): number[] {
  const nan = (v: number | bigint) => typeof v === 'number' && Number.isNaN(v);
  const indices = Array.from(values, (_, i) => i);
  indices.sort((a, b) => {
    const va = values[a]!;
    const vb = values[b]!;
    if (nan(va) || nan(vb)) return nan(va) === nan(vb) ? a - b : nan(va) ? 1 : -1;
    return va > vb ? -1 : va < vb ? 1 : a - b;
  });
  return indices.slice(0, count);
}

/**
 * A number as C's printf("%f") writes it, which is how Triton prints classification scores
 * (std::to_string): six decimals, ties to even, "-" on negative values and on -0, "inf" and "nan".
 */
export function printfFixed(value: number): string {
  if (Number.isNaN(value)) return 'nan';
  if (!Number.isFinite(value)) return value > 0 ? 'inf' : '-inf';
  const sign = value < 0 || Object.is(value, -0) ? '-' : '';
  const abs = Math.abs(value);
  // toFixed switches to exponent notation from 1e21; such doubles are integers, exact as a bigint.
  if (abs >= 1e21) return `${sign}${BigInt(abs)}.000000`;
  let digits = abs.toFixed(6);
  // toFixed rounds a tie away from zero, printf to even. A double is a tie at the sixth decimal
  // exactly when it is an odd multiple of 2^-7 (then x·10^6 = odd·15625/2); it has 7 decimals.
  const scaled = abs * 128;
  if (Number.isInteger(scaled) && scaled % 2 === 1) {
    const down = abs.toFixed(7).slice(0, -1);
    if (Number(down.at(-1)) % 2 === 0) digits = down;
  }
  return `${sign}${digits}`;
}
