import { create } from '@bufbuild/protobuf';
import { Errors, type RpcError } from '@infermesh/grpc';
import { type TensorSpec, TensorSpecSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeFromOnnx } from '@infermesh/tensors';
import { onnx } from 'onnx-proto';

/** What an ONNX model takes and returns, read from its graph. */
export interface OnnxSignature {
  inputs: TensorSpec[];
  outputs: TensorSpec[];
  /** The inputs and outputs whose first dimension is not dynamic; the model batches only when there are none. */
  unbatchable: string[];
}

function invalid(message: string): RpcError {
  return Errors.invalidArtifact(message);
}

/**
 * Reads the signature of an ONNX model file: the graph's inputs that are not initializers, and its
 * outputs, with their datatypes and shapes (-1 for a dimension that is symbolic or unknown). A file
 * that is not an ONNX model, or whose inputs or outputs the serving path cannot carry, is refused
 * with INVALID_ARGUMENT / INVALID_ARTIFACT.
 */
export function readOnnxSignature(bytes: Uint8Array): OnnxSignature {
  let model: onnx.ModelProto;
  try {
    model = onnx.ModelProto.decode(bytes);
  } catch (error) {
    throw invalid(`the artifact is not a valid ONNX model: ${error instanceof Error ? error.message : String(error)}`);
  }
  // Decoded messages are class instances; their oneof discriminators (`value`) are set.
  const graph = model.graph as onnx.GraphProto | null | undefined;
  if (graph === null || graph === undefined || toNumber(model.irVersion) <= 0) {
    throw invalid('the artifact is not a valid ONNX model: it has no ir_version or no graph');
  }
  const initializers = new Set(graph.initializer.map((tensor) => tensor.name));
  const inputs = (graph.input as onnx.ValueInfoProto[])
    .filter((value) => !initializers.has(value.name))
    .map((value) => tensorSpec(value, 'input'));
  const outputs = (graph.output as onnx.ValueInfoProto[]).map((value) => tensorSpec(value, 'output'));
  if (outputs.length === 0) throw invalid('the ONNX model has no outputs');
  const unbatchable = [...inputs, ...outputs]
    .filter((spec) => spec.shape.length === 0 || spec.shape[0] !== -1n)
    .map((spec) => spec.name);
  if (inputs.length === 0) unbatchable.push('(no inputs)');
  return { inputs, outputs, unbatchable };
}

/**
 * The max batch size of a model: the requested one when given, else the default when the model can
 * batch, else 0. A model whose first dimensions are not all dynamic cannot be given a batch size.
 */
export function maxBatchSizeFor(signature: OnnxSignature, defaultMaxBatchSize: number, requested?: number): number {
  if (requested === undefined) return signature.unbatchable.length === 0 ? defaultMaxBatchSize : 0;
  if (!Number.isInteger(requested) || requested < 0) {
    throw Errors.invalidRequest(`max_batch_size must be 0 or more, got ${requested}`);
  }
  if (requested > 0 && signature.unbatchable.length > 0) {
    throw Errors.invalidRequest(
      `max_batch_size ${requested} needs a dynamic first dimension on every input and output, but ${signature.unbatchable
        .map((name) => `"${name}"`)
        .join(', ')} ${signature.unbatchable.length === 1 ? 'has' : 'have'} none; use 0 or leave it unset`,
    );
  }
  return requested;
}

function tensorSpec(value: onnx.ValueInfoProto, role: 'input' | 'output'): TensorSpec {
  const name = value.name;
  if (name === '') throw invalid(`the ONNX model has an ${role} without a name`);
  const type = value.type as onnx.TypeProto | null | undefined;
  const kind = type?.value;
  if (type?.tensorType === null || type?.tensorType === undefined || (kind !== undefined && kind !== 'tensorType')) {
    throw invalid(
      `${role} "${name}" is ${kind === undefined ? 'untyped' : `a ${kind.replace(/Type$/, '')}`}; only tensor inputs and outputs are supported`,
    );
  }
  const elemType = type.tensorType.elemType ?? 0;
  const datatype = datatypeFromOnnx(elemType);
  if (datatype === undefined)
    throw invalid(`${role} "${name}" has ONNX element type ${elemType}, which is not supported`);
  const shape = type.tensorType.shape;
  if (shape === null || shape === undefined) {
    throw invalid(
      `${role} "${name}" has no shape (unknown rank); export the model with shapes on its inputs and outputs`,
    );
  }
  return create(TensorSpecSchema, {
    name,
    datatype,
    shape: (shape.dim as onnx.TensorShapeProto.Dimension[]).map((dim) =>
      dim.value === 'dimValue' && toNumber(dim.dimValue) >= 0 ? BigInt(toNumber(dim.dimValue)) : -1n,
    ),
  });
}

/** A protobufjs int64 (a number or a Long) as a number. */
function toNumber(value: number | { toNumber(): number } | null | undefined): number {
  if (value === null || value === undefined) return 0;
  return typeof value === 'number' ? value : value.toNumber();
}
