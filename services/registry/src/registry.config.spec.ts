import { ConfigError } from '@infermesh/config';
import { resolve } from 'node:path';
import { loadRegistryConfig } from './registry.config';

describe(loadRegistryConfig.name, () => {
  it('has defaults for every setting: embedded store under .infermesh/registry, 2 GiB artifacts, batch 64, 10 s drain grace', () => {
    const sut = loadRegistryConfig({});
    expect(sut.runtime.grpc).toEqual({ host: '127.0.0.1', port: 50051 });
    expect(sut.runtime.metrics).toEqual({ host: '127.0.0.1', port: 9101 });
    expect(sut.redisUrl).toBeUndefined();
    expect(sut.dataDir).toBe(resolve('.infermesh/registry'));
    expect(sut.metadataFile).toBe(resolve('.infermesh/registry/models.json'));
    expect(sut.artifactDir).toBe(resolve('.infermesh/registry/artifacts'));
    expect(sut.maxArtifactBytes).toBe(2 * 1024 ** 3);
    expect(sut.drainGraceMs).toBe(10_000);
    expect(sut.drainSweepIntervalMs).toBe(1_000);
    expect(sut.watchPollMs).toBe(250);
    expect(sut.defaultMaxBatchSize).toBe(64);
    expect(sut.downloadChunkBytes).toBe(1024 * 1024);
  });

  it('puts the artifacts under the data directory unless told otherwise', () => {
    expect(loadRegistryConfig({ REGISTRY_DATA_DIR: '/srv/registry' }).artifactDir).toBe('/srv/registry/artifacts');
    const sut = loadRegistryConfig({
      REGISTRY_DATA_DIR: '/srv/registry',
      REGISTRY_ARTIFACT_DIR: '/mnt/artifacts',
      REDIS_URL: 'redis://r:6379',
    });
    expect(sut.artifactDir).toBe('/mnt/artifacts');
    expect(sut.redisUrl).toBe('redis://r:6379');
  });

  it('takes the artifact limit with a unit, and sweeps drained versions a tenth of the grace apart', () => {
    expect(loadRegistryConfig({ REGISTRY_MAX_ARTIFACT_BYTES: '512MiB' }).maxArtifactBytes).toBe(512 * 1024 ** 2);
    expect(loadRegistryConfig({ REGISTRY_MAX_ARTIFACT_BYTES: '4096' }).maxArtifactBytes).toBe(4096);
    expect(loadRegistryConfig({ REGISTRY_DRAIN_GRACE_MS: '2000' }).drainSweepIntervalMs).toBe(200);
    expect(loadRegistryConfig({ REGISTRY_DRAIN_GRACE_MS: '0' }).drainSweepIntervalMs).toBe(10);
  });

  it('keeps download chunks within the largest gRPC message', () => {
    expect(loadRegistryConfig({ REGISTRY_MAX_MESSAGE_BYTES: String(256 * 1024) }).downloadChunkBytes).toBe(255 * 1024);
  });

  it('names the variable that is wrong', () => {
    expect(() => loadRegistryConfig({ REGISTRY_DEFAULT_MAX_BATCH_SIZE: '0' })).toThrow(
      /REGISTRY_DEFAULT_MAX_BATCH_SIZE: .*\(got "0"\)/,
    );
    expect(() => loadRegistryConfig({ REGISTRY_MAX_ARTIFACT_BYTES: 'lots' })).toThrow(
      /REGISTRY_MAX_ARTIFACT_BYTES: .*\(got "lots"\)/,
    );
    expect(() => loadRegistryConfig({ REGISTRY_DRAIN_GRACE_MS: '-1' })).toThrow(
      /REGISTRY_DRAIN_GRACE_MS: .*\(got "-1"\)/,
    );
    expect(() => loadRegistryConfig({ REGISTRY_WATCH_POLL_MS: '0' })).toThrow(/REGISTRY_WATCH_POLL_MS/);
    expect(() => loadRegistryConfig({ REDIS_URL: 'localhost:6379' })).toThrow(ConfigError);
  });
});
