import { create } from '@bufbuild/protobuf';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  BatchingSchema,
  type Model,
  ModelSchema,
  ProcessingSchema,
  VersionState,
  WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger } from '@infermesh/telemetry';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ModelStore } from './model-store';
import { EmbeddedModelStore } from './model-store.embedded';
import { RedisModelStores } from './model-store.redis.testing';

const logger = new JsonLogger('test', 'error');

function model(id: string, versionIds: string[] = []): Model {
  return create(ModelSchema, {
    name: `models/${id}`,
    platform: 'onnxruntime_onnx',
    versions: versionIds.map((v) => ({ name: `models/${id}/versions/${v}`, state: VersionState.REGISTERED })),
  });
}

function withVersion(current: Model | undefined, id: string, versionId: string): Model {
  const next = current ?? model(id);
  next.versions.push(...model(id, [versionId]).versions);
  return next;
}

interface Backing {
  /** A new store over the same data, as after a restart. */
  reopen(): Promise<ModelStore>;
  /** Stores that write concurrently to the same data in production. */
  writers(sut: ModelStore): Promise<ModelStore[]>;
}

/** One contract, run against every implementation. */
function contract(name: string, makeBacking: () => Backing) {
  describe(`ModelStore contract: ${name}`, () => {
    let backing: Backing;
    let sut: ModelStore;
    beforeEach(async () => {
      backing = makeBacking();
      sut = await backing.reopen();
    });

    it('starts empty at revision 0', async () => {
      expect(await sut.get('mlp')).toBeUndefined();
      expect(await sut.list()).toEqual([]);
      expect(await sut.revision()).toBe(0);
    });

    it('creates a model and returns it as stored', async () => {
      const stored = await sut.update('mlp', (current) => (current === undefined ? model('mlp', ['1']) : undefined));
      expect(stored?.versions.map((v) => v.name)).toEqual(['models/mlp/versions/1']);
      const read = await sut.get('mlp');
      expect(read?.name).toBe('models/mlp');
      expect(read?.platform).toBe('onnxruntime_onnx');
      expect(read?.versions[0]?.state).toBe(VersionState.REGISTERED);
    });

    it('hands the mutation the current model and bumps the revision on each change', async () => {
      await sut.update('mlp', (current) => withVersion(current, 'mlp', '1'));
      await sut.update('mlp', (current) => withVersion(current, 'mlp', '2'));
      expect((await sut.get('mlp'))?.versions.map((v) => v.name)).toEqual([
        'models/mlp/versions/1',
        'models/mlp/versions/2',
      ]);
      expect(await sut.revision()).toBe(2);
    });

    it('leaves the model and the revision alone when the mutation returns undefined', async () => {
      await sut.update('mlp', () => model('mlp', ['1']));
      const result = await sut.update('mlp', () => undefined);
      expect(result?.versions).toHaveLength(1);
      expect(await sut.revision()).toBe(1);
    });

    it('stores nothing when the mutation throws, and passes the error on', async () => {
      await sut.update('mlp', () => model('mlp', ['1']));
      await expect(
        sut.update('mlp', () => {
          throw new Error('refused');
        }),
      ).rejects.toThrow('refused');
      expect((await sut.get('mlp'))?.versions).toHaveLength(1);
      expect(await sut.revision()).toBe(1);
    });

    it('does not let a caller change the stored model through a returned object', async () => {
      const stored = await sut.update('mlp', () => model('mlp', ['1']));
      stored!.versions.length = 0;
      (await sut.get('mlp'))!.versions.length = 0;
      expect((await sut.get('mlp'))?.versions).toHaveLength(1);
    });

    it('lists every model ordered by name', async () => {
      for (const id of ['zeta', 'alpha', 'mlp']) await sut.update(id, () => model(id));
      expect((await sut.list()).map((m) => m.name)).toEqual(['models/alpha', 'models/mlp', 'models/zeta']);
    });

    it('loses no concurrent update to the same model', async () => {
      const writers = await backing.writers(sut);
      const versionIds = Array.from({ length: 30 }, (_, i) => String(i + 1));
      await Promise.all(
        versionIds.map((v, i) =>
          writers[i % writers.length]!.update('mlp', (current) => withVersion(current, 'mlp', v)),
        ),
      );
      const names = (await sut.get('mlp'))!.versions.map((v) => v.name).sort();
      expect(names).toEqual(versionIds.map((v) => `models/mlp/versions/${v}`).sort());
      expect(await sut.revision()).toBe(30);
    });

    it("keeps a version's processing, also across a restart", async () => {
      const processing = {
        inputNormalizations: [{ input: 'input', mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }],
        outputLabels: [{ output: 'scores', labels: ['cat', 'dog', 'über-bird'] }],
      };
      const withProcessing = model('classifier', ['1']);
      withProcessing.versions[0]!.processing = create(ProcessingSchema, processing);
      await sut.update('classifier', () => withProcessing);
      expect((await sut.get('classifier'))?.versions[0]?.processing).toEqual(create(ProcessingSchema, processing));
      await sut.close();
      sut = await backing.reopen();
      expect((await sut.list())[0]?.versions[0]?.processing).toEqual(create(ProcessingSchema, processing));
    });

    it("keeps a version's batching, an explicit 0 apart from unset, also across a restart", async () => {
      const batching = create(BatchingSchema, {
        maxBatchSize: 0,
        maxQueueDelayUs: 2_500n,
        preferredBatchSizes: [4, 8],
        preserveOrdering: true,
        priorityLevels: 3,
        defaultPriorityLevel: 2,
        maxQueueSize: 500,
      });
      const withBatching = model('batched', ['1', '2']);
      withBatching.versions[0]!.batching = batching;
      await sut.update('batched', () => withBatching);
      const read = async () => (await sut.get('batched'))!.versions.map((v) => v.batching);
      expect(await read()).toEqual([batching, undefined]);
      expect((await read())[0]?.maxBatchSize).toBe(0);
      await sut.close();
      sut = await backing.reopen();
      expect(await read()).toEqual([batching, undefined]);
      expect((await sut.list())[0]?.versions[0]?.batching?.maxBatchSize).toBe(0);
    });

    it("keeps a version's warm-up samples, their bytes, and its warm-up error, also across a restart", async () => {
      const warmUp = create(WarmUpSchema, {
        samples: [
          {
            name: '16 kHz',
            inputs: [
              {
                name: 'audio',
                datatype: DataType.FP32,
                shape: [1n, 2n],
                contents: { case: 'data', value: new Uint8Array(new Float32Array([0.5, -1]).buffer) },
              },
              { name: 'sr', datatype: DataType.INT64, shape: [1n], contents: { case: 'zeroData', value: true } },
            ],
          },
          {
            inputs: [
              {
                name: 'audio',
                datatype: DataType.FP32,
                shape: [1n, 512n],
                contents: { case: 'randomData', value: true },
              },
            ],
          },
        ],
      });
      const warmed = model('vad', ['1', '2']);
      warmed.versions[0]!.warmUp = warmUp;
      warmed.versions[1]!.warmUpError =
        'synthetic warm-up at batch 1 failed on cpu: Pad reflect requires axis length >= 2';
      await sut.update('vad', () => warmed);
      const read = async () => (await sut.get('vad'))!.versions.map((v) => [v.warmUp, v.warmUpError]);
      const expected = [
        [warmUp, ''],
        [undefined, warmed.versions[1]!.warmUpError],
      ];
      expect(await read()).toEqual(expected);
      await sut.close();
      sut = await backing.reopen();
      expect(await read()).toEqual(expected);
    });

    it('stamps each stored model with the store revision of its last change', async () => {
      expect((await sut.update('mlp', () => model('mlp', ['1'])))?.revision).toBe(1n);
      expect((await sut.update('tiny', () => model('tiny', ['1'])))?.revision).toBe(2n);
      expect((await sut.update('mlp', (current) => withVersion(current, 'mlp', '2')))?.revision).toBe(3n);
      // Whatever revision the mutation returns, the store's wins.
      expect((await sut.update('tiny', (current) => ({ ...current!, revision: 99n })))?.revision).toBe(4n);
      expect((await sut.get('mlp'))?.revision).toBe(3n);
      expect((await sut.list()).map((m) => [m.name, m.revision])).toEqual([
        ['models/mlp', 3n],
        ['models/tiny', 4n],
      ]);
      // An update that changes nothing keeps the revisions.
      expect((await sut.update('mlp', () => undefined))?.revision).toBe(3n);
    });

    it('deletes a model atomically and bumps the revision; a missing model is false', async () => {
      await sut.update('mlp', () => model('mlp', ['1']));
      await sut.update('tiny', () => model('tiny', ['1']));
      expect(await sut.delete('mlp')).toBe(true);
      expect(await sut.get('mlp')).toBeUndefined();
      expect((await sut.list()).map((m) => m.name)).toEqual(['models/tiny']);
      expect(await sut.revision()).toBe(3);
      expect(await sut.delete('mlp')).toBe(false);
      expect(await sut.revision()).toBe(3);
      // Created again, it starts afresh.
      expect(
        (await sut.update('mlp', (current) => withVersion(current, 'mlp', '7')))?.versions.map((v) => v.name),
      ).toEqual(['models/mlp/versions/7']);
      expect(await sut.revision()).toBe(4);
    });

    it('deletes nothing when the check refuses, and passes the error on', async () => {
      await sut.update('mlp', () => model('mlp', ['1']));
      const seen: string[] = [];
      await expect(
        sut.delete('mlp', (current) => {
          seen.push(current.name);
          throw new Error('still loaded');
        }),
      ).rejects.toThrow('still loaded');
      expect(seen).toEqual(['models/mlp']);
      expect((await sut.get('mlp'))?.versions).toHaveLength(1);
      expect(await sut.revision()).toBe(1);
    });

    it('checks a delete against the model as it is when deleted, not as an earlier writer saw it', async () => {
      const writers = await backing.writers(sut);
      await sut.update('mlp', () => model('mlp', ['1']));
      const other = writers[writers.length - 1]!;
      let checks = 0;
      const deleted = sut.delete('mlp', (current) => {
        checks += 1;
        if (current.versions.length > 1) throw new Error('now in use');
      });
      await other.update('mlp', (current) => withVersion(current, 'mlp', '2'));
      // Either the delete ran first (and the update then created the model afresh) or it saw version 2.
      const outcome = await deleted.then(
        () => 'deleted',
        (error: Error) => error.message,
      );
      const versions = (await sut.get('mlp'))?.versions.map((v) => v.name) ?? [];
      expect(checks).toBeGreaterThanOrEqual(1);
      expect([outcome, versions]).toEqual(
        outcome === 'deleted'
          ? ['deleted', ['models/mlp/versions/2']]
          : ['now in use', ['models/mlp/versions/1', 'models/mlp/versions/2']],
      );
    });

    it('keeps models with their versions, states, policies, settings and revisions across a restart, and deletions too', async () => {
      const full = create(ModelSchema, {
        name: 'models/mlp',
        platform: 'onnxruntime_onnx',
        versions: [
          {
            name: 'models/mlp/versions/1',
            state: VersionState.RETIRED,
            artifact: { sha256: 'a'.repeat(64), sizeBytes: 10n, format: 'onnx' },
          },
          {
            name: 'models/mlp/versions/2',
            state: VersionState.DRAINING,
            stateReason: 'left the serving set, draining',
          },
          { name: 'models/mlp/versions/3', state: VersionState.READY, signature: { maxBatchSize: 8 } },
          { name: 'models/mlp/versions/4', state: VersionState.FAILED, stateReason: 'out of memory' },
        ],
        rollout: { stableVersion: '3', canary: { version: '2', percent: 10 }, fallbackModel: 'tiny' },
        cache: { enabled: false, ttlMs: 1_000n },
        labels: { team: 'vision', tier: 'gold' },
        pinned: true,
        versionPolicy: { policy: { case: 'specific', value: { versions: ['2', '3'] } } },
        unloaded: true,
      });
      await sut.update('tiny', () => model('tiny', ['1']));
      await sut.update('gone', () => model('gone', ['1']));
      const stored = await sut.update('mlp', () => full);
      await sut.delete('gone');
      const revision = await sut.revision();
      await sut.close();

      sut = await backing.reopen();
      expect(await sut.revision()).toBe(revision);
      expect(await sut.get('mlp')).toEqual({ ...full, revision: 3n });
      expect(await sut.get('mlp')).toEqual(stored);
      expect(await sut.get('gone')).toBeUndefined();
      expect((await sut.list()).map((m) => [m.name, m.revision])).toEqual([
        ['models/mlp', 3n],
        ['models/tiny', 1n],
      ]);
      // It goes on from there.
      expect((await sut.update('tiny', (current) => withVersion(current, 'tiny', '2')))?.revision).toBe(
        BigInt(revision + 1),
      );
    });

    it('keeps everything across a restart', async () => {
      await sut.update('mlp', () => model('mlp', ['1', '2']));
      await sut.update('tiny', () => model('tiny', ['7']));
      await sut.close();
      sut = await backing.reopen();
      expect((await sut.list()).map((m) => [m.name, m.versions.length])).toEqual([
        ['models/mlp', 2],
        ['models/tiny', 1],
      ]);
      expect(await sut.revision()).toBe(2);
    });
  });
}

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'infermesh-registry-'));
  dirs.push(dir);
  return dir;
}

contract('embedded', () => {
  const file = join(tempDir(), 'nested', 'models.json');
  return {
    reopen: async () => new EmbeddedModelStore(file),
    writers: async (sut) => [sut],
  };
});

const stores = new RedisModelStores(logger);
beforeAll(() => stores.start());
afterAll(() => stores.stop());
const redisStore = (prefix: string) => stores.open(prefix);
contract('redis', () => {
  const prefix = `test:${randomBytes(4).toString('hex')}:`;
  return {
    reopen: () => redisStore(prefix),
    // Separate connections, as separate registry replicas would have.
    writers: async (sut) => [sut, await redisStore(prefix), await redisStore(prefix)],
  };
});

describe(EmbeddedModelStore.name, () => {
  it('writes the file atomically and leaves no temporary file behind', async () => {
    const dir = tempDir();
    const file = join(dir, 'models.json');
    const sut = new EmbeddedModelStore(file);
    await Promise.all(['a', 'b', 'c'].map((id) => sut.update(id, () => model(id, ['1']))));
    expect(readdirSync(dir)).toEqual(['models.json']);
    const content = JSON.parse(readFileSync(file, 'utf8')) as { revision: number; models: Record<string, unknown> };
    expect(content.revision).toBe(3);
    expect(Object.keys(content.models)).toEqual(['a', 'b', 'c']);
  });

  it('refuses to start on a corrupt file instead of replacing it', () => {
    const file = join(tempDir(), 'models.json');
    writeFileSync(file, '{"revision": 3, "models": ');
    expect(() => new EmbeddedModelStore(file)).toThrow(/models\.json is corrupt/);
    expect(readFileSync(file, 'utf8')).toBe('{"revision": 3, "models": ');
  });
});
