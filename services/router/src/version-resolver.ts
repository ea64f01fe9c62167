import { Inject, Injectable } from '@nestjs/common';
import { RpcError } from '@infermesh/grpc';
import type { CachePolicy, Model, ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { route, type RouteKind, shadowOf } from '@infermesh/rollout';
import { LookupMemo } from '@infermesh/runtime';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { RegistryAdapter } from './upstreams.adapter';

export interface Resolved {
  version: ModelVersion;
  /** How it was chosen: named by the request, or by the model's rollout policy. */
  route: RouteKind | 'explicit';
  /** The version that also runs the request in the background, when the policy mirrors it. */
  shadow?: ModelVersion | undefined;
  /** How the model's results are cached; undefined: the router's defaults. */
  cache?: CachePolicy | undefined;
}

/**
 * Resolves a request to the version that serves it: the version it names (checked by the registry),
 * or, when it names none, the one the model's rollout policy gives its routing key. Registry answers
 * are reused for ROUTER_RESOLVE_TTL_MS so that the registry is not asked on every request; after that
 * they are fetched again in the background while the last one serves, and kept while the registry
 * is down. Concurrent lookups of the same key share one registry call.
 */
@Injectable()
export class VersionResolver {
  private readonly versions: LookupMemo<ModelVersion>;
  private readonly models: LookupMemo<Model>;

  constructor(registry: RegistryAdapter, @Inject(ROUTER_CONFIG) config: RouterConfig) {
    // Past its time an answer still serves while a fresh one is fetched, and stays while the
    // registry is down: the data plane keeps its last configuration.
    const options = { ttlMs: config.resolveTtlMs, keepStale: true };
    this.versions = new LookupMemo((key) => {
      const [model, versionId] = key.split('\u0000') as [string, string];
      return registry.resolve(model, versionId);
    }, options);
    this.models = new LookupMemo((model) => registry.getModel(model), options);
  }

  /** The model that answers for this one, marked degraded, when it cannot; empty when none. */
  async fallbackOf(model: string): Promise<string> {
    return (await this.models.get(model)).rollout?.fallbackModel ?? '';
  }

  async resolve(model: string, versionId: string, routingKey = ''): Promise<Resolved> {
    if (versionId !== '') {
      const [version, found] = await Promise.all([this.versions.get(`${model}\u0000${versionId}`), this.models.get(model).catch(() => undefined)]);
      return { version, route: 'explicit', cache: found?.cache };
    }
    const found = await this.models.get(model);
    const chosen = route(found, routingKey);
    if (chosen === undefined) throw RpcError.unavailable(`model "${model}" has no READY version`, 'MODEL_NOT_READY');
    return { version: chosen.version, route: chosen.kind, shadow: shadowOf(found, chosen.version), cache: found.cache };
  }
}
