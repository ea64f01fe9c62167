import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { type Model, ModelSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { Redis } from '@infermesh/redis';
import { ModelStore, type ModelMutation } from './model-store';

/**
 * Writes a model only when its per-model revision is still the one the writer read (compare and set),
 * adds it to the index and bumps the store-wide revision, all atomically. Returns the new store-wide
 * revision, or -1 when another writer got there first.
 * KEYS: model hash, index set, revision counter. ARGV: expected model revision, model bytes, model id.
 */
const COMPARE_AND_SET = `
local current = redis.call('HGET', KEYS[1], 'rev') or '0'
if current ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'rev', tostring(tonumber(current) + 1))
redis.call('SADD', KEYS[2], ARGV[3])
return redis.call('INCR', KEYS[3])
`;

/** Attempts before an update that keeps losing races gives up. */
const MAX_ATTEMPTS = 100;

/**
 * Metadata in Redis, shared by every registry replica. Layout under the prefix:
 * `model:{id}` is a hash with `data` (the Model protobuf, binary) and `rev` (that model's revision);
 * `models` is the set of model ids; `revision` is the store-wide revision counter. Updates are
 * optimistic: read, mutate, then a compare-and-set script that fails when the model changed meanwhile.
 */
export class RedisModelStore extends ModelStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    super();
  }

  async get(modelId: string): Promise<Model | undefined> {
    return (await this.read(modelId)).model;
  }

  async list(): Promise<Model[]> {
    const ids = (await this.redis.smembers(this.key('models'))).sort();
    if (ids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hgetBuffer(this.modelKey(id), 'data');
    const results = (await pipeline.exec()) ?? [];
    const models: Model[] = [];
    for (const [error, data] of results) {
      if (error) throw error;
      if (data instanceof Buffer) models.push(fromBinary(ModelSchema, data));
    }
    return models;
  }

  async update(modelId: string, mutate: ModelMutation): Promise<Model | undefined> {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt += 1) {
      const { model: current, rev } = await this.read(modelId);
      const next = mutate(current);
      if (next === undefined) return current;
      const bytes = Buffer.from(toBinary(ModelSchema, next));
      const keys = [this.modelKey(modelId), this.key('models'), this.key('revision')];
      const outcome = (await this.redis.eval(COMPARE_AND_SET, keys.length, ...keys, rev, bytes, modelId)) as number;
      if (outcome !== -1) return next;
    }
    throw new Error(`model ${modelId}: gave up after ${MAX_ATTEMPTS} conflicting concurrent updates`);
  }

  async revision(): Promise<number> {
    return Number((await this.redis.get(this.key('revision'))) ?? 0);
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }

  private async read(modelId: string): Promise<{ model: Model | undefined; rev: string }> {
    const [data, rev] = await this.redis.hmgetBuffer(this.modelKey(modelId), 'data', 'rev');
    return {
      model: data ? fromBinary(ModelSchema, data) : undefined,
      rev: rev ? rev.toString() : '0',
    };
  }

  private modelKey(modelId: string): string {
    return this.key(`model:${modelId}`);
  }

  private key(name: string): string {
    return this.prefix + name;
  }
}
