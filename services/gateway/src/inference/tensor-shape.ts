import { Errors } from '@infermesh/grpc';
import type { Tensor } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  ALL_DATATYPES,
  DataType,
  datatypeFromName,
  datatypeInfo,
  decodeBytesElements,
  UNSERVED_DATATYPES,
  unservableBytesElement,
} from '@infermesh/tensors';

/** The datatypes a request may use, as listed in error messages. */
const SERVED_NAMES = ALL_DATATYPES.filter((info) => !UNSERVED_DATATYPES.has(info.type))
  .map((info) => info.name)
  .join(', ');

/**
 * A tensor's datatype from its KServe name; INVALID_ARGUMENT naming the tensor for a missing or
 * unknown name, UNIMPLEMENTED for a datatype that cannot be served (BF16). Both come before any
 * conversion and before the router compares the request with the model's signature.
 */
export function tensorDatatype(tensor: string, name: unknown): DataType {
  if (typeof name !== 'string' || name === '') {
    throw Errors.invalidTensor(`input "${tensor}" has no datatype; use one of ${SERVED_NAMES}`);
  }
  const type = datatypeFromName(name);
  if (type === undefined) {
    throw Errors.invalidTensor(
      `input "${tensor}" has unknown datatype ${JSON.stringify(name)}; use one of ${SERVED_NAMES}`,
    );
  }
  if (UNSERVED_DATATYPES.has(type)) {
    throw Errors.datatypeUnsupported(
      `input "${tensor}" has datatype ${name}, which infermesh cannot serve (onnxruntime-node has no ${datatypeInfo(type).ort} tensors); send it as FP32 or FP16`,
      { metadata: { tensor, datatype: name } },
    );
  }
  return type;
}

/**
 * Checks a tensor's shape (non-negative integer dimensions) and returns its element count. Counts
 * beyond 2^53 are refused here, before any allocation is sized by them.
 */
export function tensorElementCount(tensor: string, shape: readonly (number | bigint)[]): number {
  let count = 1;
  for (const dim of shape) {
    const n = Number(dim);
    if (!Number.isSafeInteger(n) || n < 0) {
      throw Errors.invalidTensor(`input "${tensor}" has an invalid dimension ${String(dim)} in its shape`);
    }
    count *= n;
  }
  if (!Number.isSafeInteger(count)) {
    throw Errors.invalidTensor(`input "${tensor}" has a shape with too many elements`);
  }
  return count;
}

/**
 * Refuses a BYTES tensor with an element that onnxruntime-node would not hold unchanged (a NUL byte,
 * bytes that are not UTF-8) with INVALID_ARGUMENT naming the tensor and the element, rather than let
 * the model see other bytes than were sent. Tensors of other datatypes pass.
 */
export function checkBytesElements(tensor: Tensor): void {
  if (tensor.datatype !== DataType.BYTES) return;
  const bad = unservableBytesElement(decodeBytesElements(tensor.data) ?? []);
  if (bad !== undefined) {
    throw Errors.invalidTensor(
      `input "${tensor.name}": BYTES element ${bad.index} ${bad.problem}; string tensors hold NUL-free UTF-8 text only`,
    );
  }
}
