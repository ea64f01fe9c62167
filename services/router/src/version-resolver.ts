import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { Errors } from '@infermesh/grpc';
import {
  type CachePolicy,
  type Model,
  type ModelVersion,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { checkVersionId, route, type RouteKind, shadowOf, versionIdOf } from '@infermesh/rollout';
import { LookupMemo } from '@infermesh/runtime';
import { type KnownModels, ServedModels } from '@infermesh/telemetry';
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
 * Resolves a request to the version that serves it: the version it names (which must be READY), or,
 * when it names none, the one the model's rollout policy gives its routing key.
 *
 * Models come from the registry watch, so a change made in the registry applies to the next request
 * without asking it, and while the registry is down the last configuration the watch saw keeps
 * serving. A model the watch does not hold (it has not synced yet, or the model is newer than its
 * last message) is asked of the registry instead: those answers are reused for ROUTER_RESOLVE_TTL_MS,
 * then fetched again in the background while the last one serves, and kept while the registry is
 * down; concurrent lookups of the same key share one registry call.
 *
 * It knows which models and versions are registered (for metric labels): those the watch holds, and
 * those the registry resolved for it since the watch last changed.
 */
@Injectable()
export class VersionResolver implements KnownModels {
  private readonly versions: LookupMemo<ModelVersion>;
  private readonly models: LookupMemo<Model>;
  /** Model versions the registry resolved directly, while the watch did not hold them. */
  private readonly resolvedByRegistry = new ServedModels();

  constructor(
    registry: RegistryAdapter,
    private readonly watch: RegistryWatch,
    @Inject(ROUTER_CONFIG) config: RouterConfig,
    clock: Clock,
  ) {
    // Past its time an answer still serves while a fresh one is fetched, and stays while the
    // registry is down: the data plane keeps its last configuration.
    const options = { ttlMs: config.resolveTtlMs, keepStale: true, clock };
    this.versions = new LookupMemo(async (key) => {
      const [model, versionId] = key.split('\u0000') as [string, string];
      const version = await registry.resolve(model, versionId);
      this.resolvedByRegistry.remember(model, versionIdOf(version.name));
      return version;
    }, options);
    this.models = new LookupMemo(async (model) => {
      const found = await registry.getModel(model);
      for (const version of found.versions) this.resolvedByRegistry.remember(model, versionIdOf(version.name));
      return found;
    }, options);
    // Once the watch holds a model, answers fetched before it are stale; a model it dropped (deleted)
    // must be asked again rather than served from a remembered answer.
    watch.onChange(() => {
      this.versions.clear();
      this.models.clear();
      this.resolvedByRegistry.clear();
    });
  }

  hasModel(model: string): boolean {
    return this.watch.hasModel(model) || this.resolvedByRegistry.hasModel(model);
  }

  hasVersion(model: string, version: string): boolean {
    return this.watch.hasVersion(model, version) || this.resolvedByRegistry.hasVersion(model, version);
  }

  /** The model that answers for this one, marked degraded, when it cannot; empty when none. */
  async fallbackOf(model: string): Promise<string> {
    return (this.watch.model(model) ?? (await this.models.get(model))).rollout?.fallbackModel ?? '';
  }

  async resolve(model: string, versionId: string, routingKey = ''): Promise<Resolved> {
    const watched = this.watch.model(model);
    if (watched !== undefined) return resolveWatched(model, watched, versionId, routingKey);
    if (versionId !== '') {
      const [version, found] = await Promise.all([
        this.versions.get(`${model}\u0000${versionId}`),
        this.models.get(model).catch(() => undefined),
      ]);
      return { version, route: 'explicit', cache: found?.cache };
    }
    return routed(model, await this.models.get(model), routingKey);
  }
}

/** Resolves against a model as the watch holds it, with the registry's ResolveModelVersion errors. */
function resolveWatched(modelId: string, model: Model, versionId: string, routingKey: string): Resolved {
  if (versionId === '') return routed(modelId, model, routingKey);
  checkLoaded(modelId, model);
  checkVersionId(versionId);
  const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
  if (version === undefined) {
    throw Errors.versionNotFound(`model "${modelId}" has no version ${versionId}`, {
      metadata: {
        model: modelId,
        version: versionId,
      },
    });
  }
  if (version.state !== VersionState.READY) {
    const state = stateName(version.state);
    throw Errors.modelNotReady(`version ${versionId} of model "${modelId}" is ${state}, not READY`, {
      metadata: { model: modelId, version: versionId, state },
    });
  }
  return { version, route: 'explicit', cache: model.cache };
}

/** The version the model's rollout policy gives the routing key, and the shadow that mirrors it. */
function routed(modelId: string, model: Model, routingKey: string): Resolved {
  checkLoaded(modelId, model);
  const chosen = route(model, routingKey);
  if (chosen === undefined) {
    throw Errors.modelNotReady(`model "${modelId}" has no READY version`, { metadata: { model: modelId } });
  }
  return { version: chosen.version, route: chosen.kind, shadow: shadowOf(model, chosen.version), cache: model.cache };
}

/** An unloaded model (Triton's explicit model control) serves no version until it is loaded again. */
function checkLoaded(modelId: string, model: Model): void {
  if (model.unloaded) {
    throw Errors.modelNotReady(`model "${modelId}" is unloaded`, { metadata: { model: modelId } });
  }
}

/** "READY" for VersionState.READY. */
function stateName(state: VersionState): string {
  return (VersionState[state] ?? String(state)).replace(/^VERSION_STATE_/, '');
}
