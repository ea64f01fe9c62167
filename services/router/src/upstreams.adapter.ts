import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { createClient } from '@infermesh/grpc';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type Model, type ModelVersion, RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';

/** How long the router waits for the registry to resolve a version. */
const RESOLVE_TIMEOUT_MS = 5_000;

/** The registry as the router sees it: where a model name resolves to a version. */
@Injectable()
export class RegistryAdapter implements OnApplicationShutdown {
  private readonly client;

  constructor(@Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.client = createClient(RegistryService, config.upstreams.registry);
  }

  async resolve(model: string, versionId: string): Promise<ModelVersion> {
    const { version } = await this.client.resolveModelVersion({ model: `models/${model}`, versionId }, { timeoutMs: RESOLVE_TIMEOUT_MS });
    if (version === undefined) throw new Error(`registry resolved models/${model} to nothing`);
    return version;
  }

  /** The model with its versions and rollout policy. */
  async getModel(model: string): Promise<Model> {
    const { model: found } = await this.client.getModel({ name: `models/${model}` }, { timeoutMs: RESOLVE_TIMEOUT_MS });
    if (found === undefined) throw new Error(`registry answered models/${model} with nothing`);
    return found;
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}

/** The result cache service. */
@Injectable()
export class CacheAdapter implements OnApplicationShutdown {
  private readonly client;

  constructor(@Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.client = createClient(CacheService, config.upstreams.cache);
  }

  async lookup(key: Uint8Array, timeoutMs: number): Promise<InferenceResponse | undefined> {
    const result = await this.client.lookup({ key }, { timeoutMs });
    return result.found ? result.response : undefined;
  }

  async store(key: Uint8Array, response: InferenceResponse, ttlMs: number, timeoutMs: number): Promise<boolean> {
    return (await this.client.store({ key, response, ttlMs: BigInt(ttlMs) }, { timeoutMs })).stored;
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}

/** The batcher, which runs requests on workers. */
@Injectable()
export class BatcherAdapter implements OnApplicationShutdown {
  private readonly client;

  constructor(@Inject(ROUTER_CONFIG) config: RouterConfig) {
    this.client = createClient(BatcherService, config.upstreams.batcher);
  }

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const { response } = await this.client.infer({ request });
    if (response === undefined) throw new Error('the batcher answered without a response');
    return response;
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}
