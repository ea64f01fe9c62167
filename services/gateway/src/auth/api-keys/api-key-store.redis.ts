import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { type ApiKeyRecord, ApiKeyRecordSchema } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import type { Redis } from '@infermesh/redis';
import { ApiKeyStore } from './api-key-store';

/** Keys in one Redis hash, id -> the record's protobuf bytes, shared by every gateway replica. */
export class RedisApiKeyStore extends ApiKeyStore {
  private readonly hash: string;

  constructor(
    private readonly redis: Redis,
    prefix: string,
  ) {
    super();
    this.hash = `${prefix}api-keys`;
  }

  async get(id: string): Promise<ApiKeyRecord | undefined> {
    const bytes = await this.redis.hgetBuffer(this.hash, id);
    return bytes === null ? undefined : fromBinary(ApiKeyRecordSchema, bytes);
  }

  async list(): Promise<ApiKeyRecord[]> {
    const all = await this.redis.hgetallBuffer(this.hash);
    return Object.keys(all)
      .sort()
      .map((id) => fromBinary(ApiKeyRecordSchema, all[id]!));
  }

  async put(id: string, record: ApiKeyRecord): Promise<void> {
    await this.redis.hset(this.hash, id, Buffer.from(toBinary(ApiKeyRecordSchema, record)));
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }
}
