import { create } from '@bufbuild/protobuf';
import {
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type Clock, systemClock } from '@infermesh/clock';
import { LRUCache } from 'lru-cache';

/**
 * What an entry costs beyond its tensors' bytes: lru-cache's map entry and slots for it, its key,
 * the response objects. Measured with `node --expose-gc` on 20,000 entries of one 2 KiB output
 * (heap and array-buffer growth): 3,086 bytes an entry really held, 3,484 charged (1,024 + the
 * key's 128 + 256 and the name and shape for the output + 2,048 of data).
 */
export const ENTRY_OVERHEAD_BYTES = 1_024;
/** What each output adds on top of ENTRY_OVERHEAD_BYTES (its message, name, shape and byte array). */
export const OUTPUT_OVERHEAD_BYTES = 256;

/**
 * The router's own small result cache in front of the shared cache service: answers a hot request
 * without a network hop. The router holds here what the shared cache answered it, and what it
 * computed while the shared cache could not be asked (InferenceRouter). Entries are keyed like the
 * shared cache (so they never cross versions, artifacts or tenants), live `ttlMs`, and the least
 * recently used go first once the bytes held pass `maxBytes`.
 *
 * The budget bounds the memory the process really holds for the cache: an answer's tensors are
 * copied into storage of their exact size when stored (as received they are views into the gRPC
 * message or socket buffer they arrived in, and a view keeps all of that buffer alive), and each entry
 * is charged its tensors' bytes, its key and a fixed overhead for its objects.
 */
export class LocalResultCache {
  private readonly entries: LRUCache<string, InferenceResponse>;

  constructor(
    private readonly maxBytes: number,
    private readonly ttlMs: number,
    clock: Clock = systemClock,
  ) {
    this.entries = new LRUCache<string, InferenceResponse>({
      // lru-cache wants a positive budget; at 0 (the cache off) set() refuses every entry before it.
      maxSize: Math.max(maxBytes, 1),
      allowStale: false,
      updateAgeOnGet: false,
      ttlAutopurge: false,
      ttlResolution: 0,
      perf: { now: () => clock.now() },
    });
  }

  /** The answer held for `key`, unless it has expired (then it is dropped). */
  get(key: string): InferenceResponse | undefined {
    return this.entries.get(key);
  }

  /**
   * Holds an answer for `ttlMs`, or this cache's own time when that is shorter or not given. An
   * answer larger than the whole budget is not held (and does not displace what is held under its key).
   */
  set(key: string, response: InferenceResponse, ttlMs = this.ttlMs): void {
    const bytes = chargeOf(key, response);
    if (bytes > this.maxBytes) return;
    const ttl = Math.min(ttlMs, this.ttlMs);
    if (!(ttl > 0)) {
      this.entries.delete(key); // expired as soon as held (lru-cache would read a ttl of 0 as "forever")
      return;
    }
    this.entries.set(key, ownedCopy(response), { size: bytes, ttl });
  }

  /** Bytes charged to the entries held. */
  get size(): number {
    return this.entries.calculatedSize;
  }
}

/** What an entry is charged: its tensors' bytes, its key and output names (two bytes a character), and the overheads. */
export function chargeOf(key: string, response: InferenceResponse): number {
  let bytes = ENTRY_OVERHEAD_BYTES + 2 * key.length;
  for (const output of response.outputs)
    bytes += output.data.byteLength + OUTPUT_OVERHEAD_BYTES + 2 * output.name.length + 8 * output.shape.length;
  return bytes;
}

/** The response with each output's bytes in a buffer of their own, of their exact size. */
function ownedCopy(response: InferenceResponse): InferenceResponse {
  return create(InferenceResponseSchema, {
    ...response,
    outputs: response.outputs.map((output) => ({ ...output, data: new Uint8Array(output.data) })),
  });
}
