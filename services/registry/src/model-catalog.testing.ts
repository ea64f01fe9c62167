import type { Clock } from '@infermesh/clock';
import type { Env } from '@infermesh/config';
import { buildTinyModel } from '@infermesh/model-builder';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FilesystemArtifactStore } from './artifact-store.filesystem';
import { ModelCatalog } from './model-catalog';
import { EmbeddedModelStore } from './model-store.embedded';
import { ModelWatch } from './model-watch';
import { loadRegistryConfig, type RegistryConfig } from './registry.config';

/** For specs: a ModelCatalog on an embedded store in a directory of its own, with the tiny model's artifact stored. */
export interface TestCatalog {
  readonly catalog: ModelCatalog;
  readonly store: EmbeddedModelStore;
  readonly config: RegistryConfig;
  readonly logger: JsonLogger;
  readonly metrics: Metrics;
  /** The SHA-256 of the tiny model's artifact, to register versions with. */
  readonly sha256: string;
  /** Shuts the catalog down and removes its directory. */
  close(): Promise<void>;
}

export async function openTestCatalog(clock: Clock, env: Env = {}): Promise<TestCatalog> {
  const dir = mkdtempSync(join(tmpdir(), 'infermesh-catalog-'));
  const config = loadRegistryConfig({ REGISTRY_DATA_DIR: dir, ...env });
  const logger = new JsonLogger('test', 'error');
  const metrics = new Metrics('test');
  const store = new EmbeddedModelStore(config.metadataFile);
  const artifacts = new FilesystemArtifactStore(config.artifactDir);
  const { sha256 } = await artifacts.write(
    (async function* () {
      yield buildTinyModel().bytes;
    })(),
    { maxBytes: 1 << 20 },
  );
  const catalog = new ModelCatalog(
    store,
    artifacts,
    clock,
    config,
    logger,
    new ModelWatch(store, config, logger, metrics, clock),
    metrics,
  );
  return {
    catalog,
    store,
    config,
    logger,
    metrics,
    sha256,
    close: async () => {
      await catalog.onApplicationShutdown();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
