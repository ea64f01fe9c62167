import { createHash } from 'node:crypto';
import type { InferenceRequest } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';

/**
 * The result-cache key of a request for a resolved model version: SHA-256 over the scope (a tenant
 * when entries are kept per tenant, else empty), the model, the version, the SHA-256 of the
 * version's artifact (a model deleted and created again under the same version id with other
 * weights must not be answered from the old entries), each input's name,
 * datatype, shape and bytes (in name order, so input order does not matter), the requested outputs
 * in their order, and the class counts asked of outputs (in name order). Every variable-length field
 * is length-prefixed, so no two different requests share a byte stream.
 */
export function cacheKey(request: InferenceRequest, artifactSha256: string, scope = ''): Buffer {
  const hash = createHash('sha256');
  const field = (value: string | Uint8Array) => {
    const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
    const length = Buffer.allocUnsafe(8);
    length.writeBigUInt64LE(BigInt(bytes.byteLength));
    hash.update(length);
    hash.update(bytes);
  };
  field('infermesh.cache.v3');
  field(scope);
  field(request.modelName);
  field(request.modelVersion);
  field(artifactSha256);
  const inputs = [...request.inputs].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  field(String(inputs.length));
  for (const input of inputs) {
    field(input.name);
    field(String(input.datatype));
    field(input.shape.join(','));
    field(input.data);
  }
  // In the order asked for, which is the order of the response's outputs; each name length-prefixed.
  field(String(request.outputNames.length));
  for (const name of request.outputNames) field(name);
  // Top-k classes instead of an output's values are a different result.
  const classCounts = Object.entries(request.outputClassCounts).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  field(String(classCounts.length));
  for (const [name, count] of classCounts) {
    field(name);
    field(String(count));
  }
  return hash.digest();
}
