import { create } from '@bufbuild/protobuf';
import {
  type Model,
  ModelSchema,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { ManualClock, rpcRejection } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EmbeddedModelStore } from './model-store.embedded';
import { RedisModelStores } from './model-store.redis.testing';
import { ModelWatch } from './model-watch';
import { loadRegistryConfig } from './registry.config';

const logger = new JsonLogger('test', 'error');
const model = (id: string, labels: Record<string, string> = {}) =>
  create(ModelSchema, { name: `models/${id}`, platform: 'onnxruntime_onnx', labels });

/** An embedded store that counts how often it is read. */
class CountingStore extends EmbeddedModelStore {
  lists = 0;
  override list(): Promise<Model[]> {
    this.lists += 1;
    return super.list();
  }
}

/** Reads a watch stream message by message. */
function follow(sut: ModelWatch, fromRevision = 0n) {
  const controller = new AbortController();
  const stream = sut.watch(fromRevision, controller.signal);
  return {
    controller,
    next: async (): Promise<WatchModelsResponse | undefined> => {
      const result = await stream.next();
      return result.done === true ? undefined : result.value;
    },
    done: async () => (await stream.next()).done,
  };
}

const names = (message: WatchModelsResponse | undefined) => message?.models.map((m) => m.name);

describe(ModelWatch.name, () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });
  function embedded(pollMs = 3_600_000) {
    const dir = mkdtempSync(join(tmpdir(), 'infermesh-watch-'));
    dirs.push(dir);
    const config = loadRegistryConfig({ REGISTRY_DATA_DIR: dir, REGISTRY_WATCH_POLL_MS: String(pollMs) });
    const store = new CountingStore(config.metadataFile);
    const metrics = new Metrics('test');
    return { store, metrics, sut: new ModelWatch(store, config, logger, metrics) };
  }

  it('sends a snapshot with the current revision first, then each change with its models as stored, then deletions', async () => {
    const { store, sut } = embedded();
    await store.update('mlp', () => model('mlp'));
    await store.update('alpha', () => model('alpha'));
    const watcher = follow(sut);

    const snapshot = await watcher.next();
    expect([snapshot?.snapshot, snapshot?.revision, names(snapshot)]).toEqual([
      true,
      2n,
      ['models/alpha', 'models/mlp'],
    ]);

    const stored = await store.update('mlp', () => model('mlp', { team: 'vision' }));
    await sut.notify();
    expect(await watcher.next()).toEqual(create(WatchModelsResponseSchema, { revision: 3n, models: [stored!] }));

    await store.delete('alpha');
    await sut.notify();
    expect(await watcher.next()).toEqual(
      create(WatchModelsResponseSchema, { revision: 4n, deleted: ['models/alpha'] }),
    );
    watcher.controller.abort();
    expect(await watcher.done()).toBe(true);
  });

  it('sends only the revision first when the follower is current, and a snapshot when it is not', async () => {
    const { store, sut } = embedded();
    await store.update('mlp', () => model('mlp'));
    const current = follow(sut, 1n);
    expect(await current.next()).toEqual(create(WatchModelsResponseSchema, { revision: 1n }));
    const behind = follow(sut, 7n);
    expect(names(await behind.next())).toEqual(['models/mlp']);
    current.controller.abort();
    behind.controller.abort();
    // A follower that has seen nothing gets a snapshot, even of an empty registry.
    const fresh = embedded().sut;
    expect(await follow(fresh, 0n).next()).toEqual(create(WatchModelsResponseSchema, { revision: 0n, snapshot: true }));
    await fresh.close();
  });

  it('serves every watcher from one loop: one store read per change, however many watch', async () => {
    const { store, metrics, sut } = embedded();
    await store.update('mlp', () => model('mlp'));
    const watchers = [follow(sut), follow(sut), follow(sut)];
    for (const watcher of watchers) expect(names(await watcher.next())).toEqual(['models/mlp']);
    expect(store.lists).toBe(1);
    expect(await metrics.render()).toMatch(/^infermesh_test_watchers 3$/m);

    await store.update('tiny', () => model('tiny'));
    await sut.notify();
    for (const watcher of watchers) expect(names(await watcher.next())).toEqual(['models/tiny']);
    expect(store.lists).toBe(2);

    // Nothing changed: nothing is read but the revision.
    await sut.notify();
    expect(store.lists).toBe(2);

    for (const watcher of watchers) watcher.controller.abort();
    for (const watcher of watchers) expect(await watcher.done()).toBe(true);
    expect(await metrics.render()).toMatch(/^infermesh_test_watchers 0$/m);
    // With nobody watching the loop stops, and the next watcher reads afresh.
    const later = follow(sut);
    expect(names(await later.next())).toEqual(['models/mlp', 'models/tiny']);
    expect(store.lists).toBe(3);
    later.controller.abort();
  });

  it('gives a watcher that does not keep up a snapshot instead of every step, so that it still ends up right', async () => {
    const { store, sut } = embedded();
    const slow = follow(sut);
    await slow.next();
    for (let i = 0; i < 300; i += 1) {
      await store.update(`m${i % 7}`, () => model(`m${i % 7}`, { step: String(i) }));
      await sut.notify();
    }
    const held = new Map<string, Model>();
    const received: WatchModelsResponse[] = [];
    let message = await slow.next();
    expect(message?.snapshot).toBe(true);
    for (;;) {
      if (message!.snapshot) held.clear();
      for (const m of message!.models) held.set(m.name, m);
      received.push(message!);
      if (message!.revision === 300n) break;
      message = await slow.next();
    }
    expect(received.length).toBeLessThan(300);
    expect([...held.values()].sort((a, b) => a.name.localeCompare(b.name))).toEqual(await store.list());
    slow.controller.abort();
  });

  it('ends every stream when the registry shuts down, and refuses new ones', async () => {
    const { store, sut } = embedded();
    await store.update('mlp', () => model('mlp'));
    const watcher = follow(sut);
    await watcher.next();
    const pending = watcher.next();
    await sut.close();
    expect(await pending).toBeUndefined();
    const refused = await rpcRejection(follow(sut).next());
    expect(refused.message).toMatch(/shutting down/);
  });

  describe('with replicas sharing Redis', () => {
    const stores = new RedisModelStores(logger);
    beforeAll(() => stores.start());
    afterAll(() => stores.stop());
    const redisStore = (prefix: string) => stores.open(prefix);

    it('sees the changes and deletions another replica makes, without being told', async () => {
      const prefix = `test:${randomBytes(4).toString('hex')}:`;
      const [mine, theirs] = [await redisStore(prefix), await redisStore(prefix)];
      const config = loadRegistryConfig({ REGISTRY_WATCH_POLL_MS: '20' });
      const clock = new ManualClock();
      const sut = new ModelWatch(mine, config, logger, new Metrics('test'), clock);
      await theirs.update('mlp', () => model('mlp'));
      const watcher = follow(sut);
      expect(names(await watcher.next())).toEqual(['models/mlp']);

      // Each change reaches the watcher at the next look at the store, one REGISTRY_WATCH_POLL_MS on.
      const stored = await theirs.update('tiny', () => model('tiny', { team: 'nlp' }));
      clock.advance(20);
      expect(await watcher.next()).toEqual(create(WatchModelsResponseSchema, { revision: 2n, models: [stored!] }));
      await theirs.delete('mlp');
      clock.advance(20);
      expect(await watcher.next()).toEqual(
        create(WatchModelsResponseSchema, { revision: 3n, deleted: ['models/mlp'] }),
      );
      await sut.close();
    });
  });
});
