import { Inject, Injectable } from '@nestjs/common';
import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { LookupMemo } from '@infermesh/runtime';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { RegistryAdapter } from './upstreams.adapter';

/**
 * Resolves a model name (and an optional version id) to the version that serves it, reusing an
 * answer for a short time so that the registry is not asked on every request. Concurrent lookups
 * of the same key share one registry call.
 */
@Injectable()
export class VersionResolver {
  private readonly memo: LookupMemo<ModelVersion>;

  constructor(registry: RegistryAdapter, @Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.memo = new LookupMemo(
      (key) => {
        const [model, versionId] = key.split('\u0000') as [string, string];
        return registry.resolve(model, versionId);
      },
      { ttlMs: config.resolveTtlMs, keepStale: false },
    );
  }

  resolve(model: string, versionId: string): Promise<ModelVersion> {
    return this.memo.get(`${model}\u0000${versionId}`);
  }
}
