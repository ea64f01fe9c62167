import type { ApiKeyRecord } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';

/** Where API keys live: Redis (shared by gateway replicas) or a file of the gateway's own. */
export abstract class ApiKeyStore {
  /** The record of a key id, or undefined. */
  abstract get(id: string): Promise<ApiKeyRecord | undefined>;
  /** Every record, ordered by id. */
  abstract list(): Promise<ApiKeyRecord[]>;
  /** Creates or replaces the record of its key's id. */
  abstract put(id: string, record: ApiKeyRecord): Promise<void>;
  abstract close(): Promise<void>;
}
