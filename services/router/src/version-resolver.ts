import { Inject, Injectable } from '@nestjs/common';
import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { RegistryAdapter } from './upstreams.adapter';

interface Resolved {
  version: ModelVersion;
  expiresAt: number;
}

/**
 * Resolves a model name (and an optional version id) to the version that serves it, reusing an
 * answer for a short time so that the registry is not asked on every request. Concurrent lookups
 * of the same key share one registry call.
 */
@Injectable()
export class VersionResolver {
  private readonly memo = new Map<string, Resolved>();
  private readonly pending = new Map<string, Promise<ModelVersion>>();

  constructor(
    private readonly registry: RegistryAdapter,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
  ) {}

  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    const key = `${model}\u0000${versionId}`;
    const hit = this.memo.get(key);
    if (hit !== undefined && hit.expiresAt > Date.now()) return hit.version;
    const inFlight = this.pending.get(key);
    if (inFlight !== undefined) return inFlight;
    const lookup = this.registry
      .resolve(model, versionId)
      .then((version) => {
        if (this.config.resolveTtlMs > 0) this.memo.set(key, { version, expiresAt: Date.now() + this.config.resolveTtlMs });
        return version;
      })
      .finally(() => this.pending.delete(key));
    this.pending.set(key, lookup);
    return lookup;
  }
}
