import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  InferenceResponseSchema,
  type Tensor,
  TensorSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeInfo, elementCount } from '@infermesh/tensors';

const byName = (a: { name: string }, b: { name: string }) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/**
 * The items a request carries along the batch dimension (the first dimension its inputs share), or
 * undefined when it cannot join a batch: no inputs, a scalar input, or inputs that disagree on it.
 */
export function batchItems(request: InferenceRequest): number | undefined {
  let items: number | undefined;
  for (const input of request.inputs) {
    const first = input.shape[0];
    if (first === undefined) return undefined;
    const n = Number(first);
    if (items !== undefined && n !== items) return undefined;
    items = n;
  }
  return items !== undefined && items > 0 ? items : undefined;
}

/**
 * What requests must agree on to share a batch: each input's name, datatype and dimensions after the
 * first (in name order), the outputs asked for in their order, and the classes asked of outputs.
 */
export function batchKey(request: InferenceRequest): string {
  const parts: string[] = [];
  for (const input of [...request.inputs].sort(byName)) {
    parts.push(`${input.name}\u0000${input.datatype}\u0000${input.shape.slice(1).join(',')}`);
  }
  parts.push(`\u0001${request.outputNames.join('\u0000')}`);
  const counts = Object.entries(request.outputClassCounts).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  parts.push(`\u0001${counts.map(([name, n]) => `${name}=${n}`).join('\u0000')}`);
  return parts.join('\u0002');
}

/**
 * One request carrying the inputs of several (which share a batchKey), each input's bytes joined in
 * request order: tensors are row-major with the batch dimension first, and BYTES elements are
 * self-delimiting, so joining the bytes joins the items.
 */
export function concatRequests(
  requests: readonly InferenceRequest[],
  items: readonly number[],
  id: string,
): InferenceRequest {
  const first = requests[0]!;
  if (requests.length === 1) return first;
  const total = items.reduce((a, b) => a + b, 0);
  const inputs = first.inputs.map((input) => {
    const parts = requests.map((request) => request.inputs.find((i) => i.name === input.name)!.data);
    return create(TensorSchema, {
      name: input.name,
      datatype: input.datatype,
      shape: [BigInt(total), ...input.shape.slice(1)],
      data: Buffer.concat(parts),
    });
  });
  return create(InferenceRequestSchema, {
    modelName: first.modelName,
    modelVersion: first.modelVersion,
    id,
    inputs,
    outputNames: first.outputNames,
    outputClassCounts: first.outputClassCounts,
  });
}

/**
 * Splits a batch's response back into one response per request, in request order, each with its own
 * id. Every output must have the batch's item count as its first dimension: a model whose outputs do
 * not follow the batch dimension cannot be batched, and its requests fail instead of receiving
 * someone else's values.
 */
export function splitResponse(
  response: InferenceResponse,
  requests: readonly InferenceRequest[],
  items: readonly number[],
): InferenceResponse[] {
  if (requests.length === 1) return [{ ...response, id: requests[0]!.id }];
  const total = items.reduce((a, b) => a + b, 0);
  const perRequest: Tensor[][] = requests.map(() => []);
  for (const output of response.outputs) {
    const first = output.shape[0];
    if (first === undefined || Number(first) !== total) {
      throw Errors.batchSplitMismatch(
        `model "${response.modelName}" version ${response.modelVersion} returned output "${output.name}" with batch dimension ${first ?? '(none)'} for a batch of ${total} items; its outputs must follow the inputs' first dimension to be batched (set its batching max_batch_size to 0)`,
      );
    }
    const offsets = itemOffsets(output, total, response);
    let item = 0;
    for (let r = 0; r < requests.length; r++) {
      const n = items[r]!;
      perRequest[r]!.push(
        create(TensorSchema, {
          name: output.name,
          datatype: output.datatype,
          shape: [BigInt(n), ...output.shape.slice(1)],
          data: output.data.subarray(offsets[item], offsets[item + n]),
        }),
      );
      item += n;
    }
  }
  return requests.map((request, r) =>
    create(InferenceResponseSchema, {
      modelName: response.modelName,
      modelVersion: response.modelVersion,
      id: request.id,
      outputs: perRequest[r]!,
      parameters: response.parameters,
    }),
  );
}

/** The byte offset where each item of an output starts, and its end as the last entry. */
function itemOffsets(output: Tensor, total: number, response: InferenceResponse): number[] {
  const offsets = new Array<number>(total + 1);
  const bad = (what: string) =>
    Errors.batchSplitMismatch(
      `model "${response.modelName}" version ${response.modelVersion} returned output "${output.name}" with ${what}`,
    );
  if (output.datatype !== DataType.BYTES) {
    const itemBytes = elementCount(output.shape.slice(1)) * datatypeInfo(output.datatype).byteSize;
    if (itemBytes * total !== output.data.byteLength)
      throw bad(`${output.data.byteLength} bytes, not ${itemBytes * total}`);
    for (let i = 0; i <= total; i++) offsets[i] = i * itemBytes;
    return offsets;
  }
  // BYTES elements are length-prefixed: walk them, a fixed number of elements per item.
  const perItem = elementCount(output.shape.slice(1));
  const data = output.data;
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let offset = 0;
  for (let i = 0; i < total; i++) {
    offsets[i] = offset;
    for (let e = 0; e < perItem; e++) {
      if (offset + 4 > data.byteLength) throw bad('fewer BYTES elements than its shape says');
      offset += 4 + view.getUint32(offset, true);
    }
  }
  if (offset !== data.byteLength) throw bad('more bytes than its BYTES elements take');
  offsets[total] = offset;
  return offsets;
}
