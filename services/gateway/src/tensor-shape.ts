import { RpcError } from '@infermesh/grpc';
import { DATATYPE_NAMES, type DataType, datatypeFromName } from '@infermesh/tensors';

/** A tensor's datatype from its KServe name; INVALID_ARGUMENT naming the tensor otherwise. */
export function tensorDatatype(tensor: string, name: unknown): DataType {
  if (typeof name !== 'string' || name === '') {
    throw RpcError.invalidArgument(`input "${tensor}" has no datatype; use one of ${DATATYPE_NAMES.join(', ')}`, 'INVALID_TENSOR');
  }
  const type = datatypeFromName(name);
  if (type === undefined) {
    throw RpcError.invalidArgument(
      `input "${tensor}" has unknown datatype ${JSON.stringify(name)}; use one of ${DATATYPE_NAMES.join(', ')}`,
      'INVALID_TENSOR',
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
      throw RpcError.invalidArgument(`input "${tensor}" has an invalid dimension ${String(dim)} in its shape`, 'INVALID_TENSOR');
    }
    count *= n;
  }
  if (!Number.isSafeInteger(count)) {
    throw RpcError.invalidArgument(`input "${tensor}" has a shape with too many elements`, 'INVALID_TENSOR');
  }
  return count;
}
