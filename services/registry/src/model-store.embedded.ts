import { clone, fromJson, type JsonValue, toJson } from '@bufbuild/protobuf';
import { readJsonFileSync, writeFileAtomic } from '@infermesh/files';
import { type Model, ModelSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { type DeleteCheck, ModelStore, type ModelMutation } from './model-store';

interface StoreFile {
  revision: number;
  models: Record<string, JsonValue>;
}

/**
 * Metadata in one JSON file (protobuf JSON of each model) that survives restarts. Every change
 * rewrites the file atomically: write a temporary file, fsync, rename over the old one. Changes are
 * serialized in-process; one registry process owns the file.
 */
export class EmbeddedModelStore extends ModelStore {
  private models = new Map<string, Model>();
  private rev = 0;
  private queue: Promise<unknown> = Promise.resolve();

  /** Loads the file when it exists; a file that cannot be read is an error, never silently replaced. */
  constructor(private readonly file: string) {
    super();
    mkdirSync(dirname(file), { recursive: true });
    const stored = readJsonFileSync(file, 'registry metadata file', (json) => {
      const parsed = json as StoreFile;
      return {
        revision: parsed.revision,
        models: new Map(Object.entries(parsed.models).map(([id, model]) => [id, fromJson(ModelSchema, model)])),
      };
    });
    if (stored === undefined) return;
    this.rev = stored.revision;
    this.models = stored.models;
  }

  async get(modelId: string): Promise<Model | undefined> {
    const model = this.models.get(modelId);
    return model === undefined ? undefined : clone(ModelSchema, model);
  }

  async list(): Promise<Model[]> {
    return [...this.models.keys()].sort().map((id) => clone(ModelSchema, this.models.get(id)!));
  }

  update(modelId: string, mutate: ModelMutation): Promise<Model | undefined> {
    return this.serialized(async () => {
      const current = this.models.get(modelId);
      const next = mutate(current === undefined ? undefined : clone(ModelSchema, current));
      if (next === undefined) return current === undefined ? undefined : clone(ModelSchema, current);
      const stored = clone(ModelSchema, next);
      stored.revision = BigInt(this.rev + 1);
      await this.commit(new Map(this.models).set(modelId, stored));
      return clone(ModelSchema, stored);
    });
  }

  delete(modelId: string, check?: DeleteCheck): Promise<boolean> {
    return this.serialized(async () => {
      const current = this.models.get(modelId);
      if (current === undefined) return false;
      check?.(clone(ModelSchema, current));
      const models = new Map(this.models);
      models.delete(modelId);
      await this.commit(models);
      return true;
    });
  }

  async revision(): Promise<number> {
    return this.rev;
  }

  async close(): Promise<void> {
    await this.queue;
  }

  /** Runs changes one at a time, in the order they were asked for. */
  private serialized<T>(run: () => Promise<T>): Promise<T> {
    const result = this.queue.then(run, run);
    this.queue = result.catch(() => undefined);
    return result;
  }

  /** Writes the models as the next revision, then makes them current. */
  private async commit(models: Map<string, Model>): Promise<void> {
    await this.write(models, this.rev + 1);
    this.models = models;
    this.rev += 1;
  }

  private async write(models: Map<string, Model>, revision: number): Promise<void> {
    const content: StoreFile = { revision, models: {} };
    for (const id of [...models.keys()].sort()) content.models[id] = toJson(ModelSchema, models.get(id)!);
    await writeFileAtomic(this.file, `${JSON.stringify(content, null, 2)}\n`);
  }
}
