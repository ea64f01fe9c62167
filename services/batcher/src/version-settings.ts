import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { createClient, RpcError, toRpcError } from '@infermesh/grpc';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { LookupMemo } from '@infermesh/runtime';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import { type BatchingPolicy, batchingPolicy } from './batching-policy';

const LOOKUP_TIMEOUT_MS = 2_000;

/**
 * Each version's batching policy, read from the registry and reused for BATCHER_SETTINGS_TTL_MS.
 * Past that it is read again in the background while the last one keeps serving, also while the
 * registry is down.
 */
@Injectable()
export class VersionSettings implements OnApplicationShutdown {
  private readonly client;
  private readonly memo: LookupMemo<BatchingPolicy>;

  constructor(@Inject(BATCHER_CONFIG) config: BatcherConfig) {
    this.client = createClient(RegistryService, config.registryAddress);
    this.memo = new LookupMemo(
      async (name) => {
        const [, model, , versionId] = name.split('/') as [string, string, string, string];
        try {
          const { version } = await this.client.resolveModelVersion({ model: `models/${model}`, versionId }, { timeoutMs: LOOKUP_TIMEOUT_MS });
          if (version === undefined) throw new Error('the registry answered without a version');
          return batchingPolicy(version, config.defaults);
        } catch (error) {
          const rpcError = toRpcError(error);
          if (rpcError.reason !== undefined) throw rpcError; // e.g. VERSION_NOT_FOUND, as the registry said it
          throw RpcError.unavailable(`the batching settings of model "${model}" version ${versionId} cannot be read from the registry: ${rpcError.message}`);
        }
      },
      { ttlMs: config.settingsTtlMs, keepStale: true },
    );
  }

  /** The policy of models/{model}/versions/{version}. */
  policy(versionName: string): Promise<BatchingPolicy> {
    return this.memo.get(versionName);
  }

  onApplicationShutdown(): void {
    this.client.close();
  }
}
