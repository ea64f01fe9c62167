import { create, equals } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import { DataType, type TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Processing,
  ProcessingSchema,
  type Signature,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { datatypeName, formatShape } from '@infermesh/tensors';

/** The datatypes an input normalization applies to. */
const NORMALIZABLE = new Set([DataType.FP16, DataType.FP32, DataType.FP64]);
/** Outputs whose values cannot be ranked as class scores. */
const UNRANKABLE = new Set([DataType.BOOL, DataType.BYTES]);

const invalid = (message: string) => Errors.invalidRequest(`processing: ${message}`);
const quoted = (names: Iterable<string>) => [...names].map((n) => `"${n}"`).join(', ');

/**
 * Checks a version's processing against its signature and returns what to store: undefined when it
 * declares nothing. Refuses with INVALID_ARGUMENT, naming the problem: an unknown input or output, an
 * entry given twice, a normalization of an input that is not FP16/FP32/FP64, a mean or std that is
 * not finite, a std of 0, a per-channel vector whose length is not the input's fixed last dimension,
 * labels of an output that is not numeric, and labels whose count is not the output's fixed number
 * of classes.
 */
export function checkProcessing(processing: Processing | undefined, signature: Signature): Processing | undefined {
  if (processing === undefined || isEmptyProcessing(processing)) return undefined;
  const inputs = new Map(signature.inputs.map((spec) => [spec.name, spec]));
  const normalized = new Set<string>();
  for (const normalization of processing.inputNormalizations) {
    const spec = inputs.get(normalization.input);
    if (spec === undefined) {
      throw invalid(
        `the model has no input "${normalization.input}" to normalize; its inputs are ${quoted(inputs.keys())}`,
      );
    }
    if (normalized.has(spec.name)) throw invalid(`input "${spec.name}" is normalized more than once`);
    normalized.add(spec.name);
    checkNormalization(spec, normalization.mean, normalization.std, signature.maxBatchSize > 0);
  }
  const outputs = new Map(signature.outputs.map((spec) => [spec.name, spec]));
  const labelled = new Set<string>();
  for (const { output, labels } of processing.outputLabels) {
    const spec = outputs.get(output);
    if (spec === undefined)
      throw invalid(`the model has no output "${output}" to label; its outputs are ${quoted(outputs.keys())}`);
    if (labelled.has(output)) throw invalid(`output "${output}" is labelled more than once`);
    labelled.add(output);
    if (UNRANKABLE.has(spec.datatype)) {
      throw invalid(
        `output "${output}" is ${datatypeName(spec.datatype)}, not numeric scores, so it has no classes to label`,
      );
    }
    if (labels.length === 0) throw invalid(`output "${output}" is given an empty list of labels`);
    const classes = classesPerItem(spec, signature.maxBatchSize > 0);
    if (classes !== undefined && labels.length !== classes) {
      throw invalid(
        `output "${output}" ${formatShape(spec.shape)} has ${classes} classes per item but ${labels.length} labels are given`,
      );
    }
  }
  return processing;
}

/** True when two processings declare the same thing; unset and empty are the same. */
export function sameProcessing(a: Processing | undefined, b: Processing | undefined): boolean {
  return equals(ProcessingSchema, a ?? create(ProcessingSchema), b ?? create(ProcessingSchema));
}

function isEmptyProcessing(processing: Processing): boolean {
  return processing.inputNormalizations.length === 0 && processing.outputLabels.length === 0;
}

function checkNormalization(spec: TensorSpec, mean: readonly number[], std: readonly number[], batches: boolean): void {
  const name = spec.name;
  if (!NORMALIZABLE.has(spec.datatype)) {
    throw invalid(
      `input "${name}" is ${datatypeName(spec.datatype)}; only FP16, FP32 and FP64 inputs can be normalized`,
    );
  }
  if (mean.length === 0 && std.length === 0)
    throw invalid(`the normalization of input "${name}" gives neither mean nor std`);
  for (const [field, values] of [
    ['mean', mean],
    ['std', std],
  ] as const) {
    const bad = values.findIndex((v) => !Number.isFinite(v));
    if (bad >= 0) throw invalid(`input "${name}": ${field}[${bad}] is ${values[bad]}, not a finite number`);
    if (values.length <= 1) continue;
    const rank = spec.shape.length;
    if (rank === 0 || (rank === 1 && batches)) {
      throw invalid(
        `input "${name}" ${formatShape(spec.shape)} has no dimension to give ${field} per position along; give a single ${field}`,
      );
    }
    const last = Number(spec.shape[rank - 1]);
    if (last >= 0 && values.length !== last) {
      throw invalid(
        `input "${name}": ${field} has ${values.length} values but the last dimension of ${formatShape(spec.shape)} is ${last}; give 1 or ${last}`,
      );
    }
  }
  if (mean.length > 1 && std.length > 1 && mean.length !== std.length) {
    throw invalid(`input "${name}": mean has ${mean.length} values but std has ${std.length}`);
  }
  const zero = std.indexOf(0);
  if (zero >= 0)
    throw invalid(`input "${name}": std${std.length > 1 ? `[${zero}]` : ''} is 0; a normalization cannot divide by 0`);
}

/**
 * The number of classes of one item of an output: its elements past the batch dimension (all of
 * them for a model that does not batch); undefined when a dimension is dynamic.
 */
function classesPerItem(spec: TensorSpec, batches: boolean): number | undefined {
  const dims = batches ? spec.shape.slice(1) : spec.shape;
  if (dims.some((d) => d < 0n)) return undefined;
  return dims.reduce((count, d) => count * Number(d), 1);
}
