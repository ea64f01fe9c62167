import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { type Model, ModelSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { Redis } from '@infermesh/redis';
import { type DeleteCheck, ModelStore, type ModelMutation } from './model-store';

/**
 * Writes a model only when its per-model revision is still the one the writer read (compare and set),
 * bumps the store-wide revision and stamps the model with it, and adds it to the index, all
 * atomically. Returns the new store-wide revision, or -1 when another writer got there first.
 * KEYS: model hash, index set, revision counter. ARGV: expected model revision, model bytes, model id.
 */
const COMPARE_AND_SET = `
local current = redis.call('HGET', KEYS[1], 'rev') or '0'
if current ~= ARGV[1] then return -1 end
local revision = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'rev', tostring(tonumber(current) + 1), 'srev', tostring(revision))
redis.call('SADD', KEYS[2], ARGV[3])
return revision
`;

/**
 * Deletes a model only when its per-model revision is still the one the checker read. The hash stays
 * as a tombstone holding the per-model revision, one more than before, so that a writer that read the
 * model before the delete cannot overwrite a model created again since. Returns the new store-wide
 * revision, or -1 when another writer got there first.
 * KEYS: model hash, index set, revision counter. ARGV: expected model revision, model id.
 */
const COMPARE_AND_DELETE = `
local current = redis.call('HGET', KEYS[1], 'rev') or '0'
if current ~= ARGV[1] then return -1 end
redis.call('HDEL', KEYS[1], 'data', 'srev')
redis.call('HSET', KEYS[1], 'rev', tostring(tonumber(current) + 1))
redis.call('SREM', KEYS[2], ARGV[2])
return redis.call('INCR', KEYS[3])
`;

/** Attempts before an update that keeps losing races gives up. */
const MAX_ATTEMPTS = 100;

/**
 * Metadata in Redis, shared by every registry replica. Layout under the prefix:
 * `model:{id}` is a hash with `data` (the Model protobuf, binary), `rev` (that model's own change
 * counter, for compare and set) and `srev` (the store-wide revision of its last change, which is its
 * Model.revision); `models` is the set of model ids; `revision` is the store-wide revision counter.
 * Updates are optimistic: read, mutate, then a compare-and-set script that fails when the model
 * changed meanwhile.
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
    for (const id of ids) pipeline.hmgetBuffer(this.modelKey(id), 'data', 'srev');
    const results = (await pipeline.exec()) ?? [];
    const models: Model[] = [];
    for (const [error, fields] of results) {
      if (error) throw error;
      const [data, srev] = fields as (Buffer | null)[];
      if (data instanceof Buffer) models.push(decode(data, srev ?? null));
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
      if (outcome !== -1) {
        next.revision = BigInt(outcome);
        return next;
      }
    }
    throw new Error(`model ${modelId}: gave up after ${MAX_ATTEMPTS} conflicting concurrent updates`);
  }

  async delete(modelId: string, check?: DeleteCheck): Promise<boolean> {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt += 1) {
      const { model: current, rev } = await this.read(modelId);
      if (current === undefined) return false;
      check?.(current);
      const keys = [this.modelKey(modelId), this.key('models'), this.key('revision')];
      const outcome = (await this.redis.eval(COMPARE_AND_DELETE, keys.length, ...keys, rev, modelId)) as number;
      if (outcome !== -1) return true;
    }
    throw new Error(`model ${modelId}: gave up deleting after ${MAX_ATTEMPTS} conflicting concurrent updates`);
  }

  async revision(): Promise<number> {
    return Number((await this.redis.get(this.key('revision'))) ?? 0);
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }

  private async read(modelId: string): Promise<{ model: Model | undefined; rev: string }> {
    const [data, rev, srev] = await this.redis.hmgetBuffer(this.modelKey(modelId), 'data', 'rev', 'srev');
    return {
      model: data ? decode(data, srev ?? null) : undefined,
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

/** A stored model, stamped with the store revision of its last change. */
function decode(data: Buffer, srev: Buffer | null): Model {
  const model = fromBinary(ModelSchema, data);
  model.revision = srev === null ? 0n : BigInt(srev.toString());
  return model;
}
