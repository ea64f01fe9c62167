import { clone, fromJson, type JsonValue, toJson } from '@bufbuild/protobuf';
import { readJsonFileSync, writeFileAtomic } from '@infermesh/files';
import { type ApiKeyRecord, ApiKeyRecordSchema } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import { ApiKeyStore } from './api-key-store';

/**
 * Keys in one JSON file (protobuf JSON of each record) that survives restarts, rewritten atomically
 * on every change. One gateway process owns the file; several replicas share keys through Redis.
 */
export class EmbeddedApiKeyStore extends ApiKeyStore {
  private records = new Map<string, ApiKeyRecord>();
  private queue: Promise<unknown> = Promise.resolve();

  /**
   * Loads the file when it exists; a file that cannot be read is an error, never silently replaced.
   * Its folder is created with the first key, so a gateway without stored keys writes nothing.
   */
  constructor(private readonly file: string) {
    super();
    const stored = readJsonFileSync(file, 'API key file', (json) =>
      Object.entries(json as Record<string, JsonValue>).map(
        ([id, record]) => [id, fromJson(ApiKeyRecordSchema, record)] as const,
      ),
    );
    this.records = new Map(stored);
  }

  async get(id: string): Promise<ApiKeyRecord | undefined> {
    const record = this.records.get(id);
    return record === undefined ? undefined : clone(ApiKeyRecordSchema, record);
  }

  async list(): Promise<ApiKeyRecord[]> {
    return [...this.records.keys()].sort().map((id) => clone(ApiKeyRecordSchema, this.records.get(id)!));
  }

  put(id: string, record: ApiKeyRecord): Promise<void> {
    const run = async () => {
      const next = new Map(this.records).set(id, clone(ApiKeyRecordSchema, record));
      const content: Record<string, JsonValue> = {};
      for (const key of [...next.keys()].sort()) content[key] = toJson(ApiKeyRecordSchema, next.get(key)!);
      await mkdir(dirname(this.file), { recursive: true });
      await writeFileAtomic(this.file, `${JSON.stringify(content, null, 2)}\n`);
      this.records = next;
    };
    const result = this.queue.then(run, run);
    this.queue = result.catch(() => undefined);
    return result;
  }

  async close(): Promise<void> {
    await this.queue;
  }
}
