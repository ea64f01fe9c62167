import { Errors } from '@infermesh/grpc';
import { quoted } from '@infermesh/tensors';

/**
 * What one inference request may hold, checked on REST (JSON and binary) and gRPC (raw and typed)
 * before any tensor is converted or copied. The body and message size limits (413,
 * RESOURCE_EXHAUSTED) are separate: these bound what a small body can ask for.
 */
export interface TensorLimits {
  /** Inputs per request (GATEWAY_MAX_INPUTS). */
  readonly maxInputs: number;
  /** Elements per tensor, the product of its shape (GATEWAY_MAX_TENSOR_ELEMENTS). */
  readonly maxTensorElements: number;
  /** A tensor's first dimension (GATEWAY_MAX_BATCH_SIZE). */
  readonly maxBatchSize: number;
  /** Any name the request gives, in UTF-8 bytes: model, version, tensors, parameter keys, request id (GATEWAY_MAX_NAME_BYTES). */
  readonly maxNameBytes: number;
}

/** The defaults of GATEWAY_MAX_INPUTS, GATEWAY_MAX_TENSOR_ELEMENTS, GATEWAY_MAX_BATCH_SIZE and GATEWAY_MAX_NAME_BYTES. */
export const DEFAULT_TENSOR_LIMITS: TensorLimits = {
  maxInputs: 64,
  maxTensorElements: 16_777_216,
  maxBatchSize: 4_096,
  maxNameBytes: 1_024,
};

/**
 * Refuses a name longer than GATEWAY_MAX_NAME_BYTES, before it is used or quoted anywhere: `what`
 * says which name (e.g. `input name`, `the request id`), the message shows its start and its size.
 */
export function checkName(what: string, name: string, limits: Pick<TensorLimits, 'maxNameBytes'>): void {
  if (name.length * 3 <= limits.maxNameBytes) return; // no UTF-8 character takes more than 3 bytes per UTF-16 unit
  const bytes = Buffer.byteLength(name, 'utf8');
  if (bytes <= limits.maxNameBytes) return;
  throw Errors.invalidRequest(
    `${what} ${quoted(name)} is ${bytes} bytes, over the gateway's limit of ${limits.maxNameBytes} bytes per name (GATEWAY_MAX_NAME_BYTES)`,
    { metadata: { limit: 'GATEWAY_MAX_NAME_BYTES' } },
  );
}

/** Refuses parameters (a JSON object or a map of InferParameters) with a key longer than GATEWAY_MAX_NAME_BYTES; `where` says whose they are. */
export function checkParameterKeys(
  where: string,
  parameters: unknown,
  limits: Pick<TensorLimits, 'maxNameBytes'>,
): void {
  if (typeof parameters !== 'object' || parameters === null) return;
  for (const key of Object.keys(parameters)) checkName(`${where}: parameter name`, key, limits);
}

/** Refuses a request with more inputs than the limit, before any of them is looked at. */
export function checkInputCount(count: number, limits: TensorLimits): void {
  if (count > limits.maxInputs) {
    throw Errors.invalidRequest(
      `the request has ${count} inputs, over the gateway's limit of ${limits.maxInputs} inputs per request (GATEWAY_MAX_INPUTS)`,
      { metadata: { limit: 'GATEWAY_MAX_INPUTS' } },
    );
  }
}

/** Refuses a tensor over the element or batch-size limit, naming it and the limit; `count` is its element count. */
export function checkTensorSize(
  tensor: string,
  shape: readonly (number | bigint)[],
  count: number,
  limits: TensorLimits,
): void {
  if (count > limits.maxTensorElements) {
    throw Errors.invalidTensor(
      `input ${quoted(tensor)} has ${count} elements, over the gateway's limit of ${limits.maxTensorElements} elements per tensor (GATEWAY_MAX_TENSOR_ELEMENTS)`,
      { metadata: { tensor, limit: 'GATEWAY_MAX_TENSOR_ELEMENTS' } },
    );
  }
  const batch = shape.length > 0 ? Number(shape[0]) : 0;
  if (batch > limits.maxBatchSize) {
    throw Errors.invalidTensor(
      `input ${quoted(tensor)} has a batch size (first dimension) of ${batch}, over the gateway's limit of ${limits.maxBatchSize} (GATEWAY_MAX_BATCH_SIZE)`,
      { metadata: { tensor, limit: 'GATEWAY_MAX_BATCH_SIZE' } },
    );
  }
}
