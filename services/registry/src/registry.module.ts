import { type DynamicModule, Module } from '@nestjs/common';
import { createRedisClient, waitForRedis } from '@infermesh/redis';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger } from '@infermesh/telemetry';
import { ArtifactStore } from './artifact-store';
import { FilesystemArtifactStore } from './artifact-store.filesystem';
import { ArtifactTransfer } from './artifact-transfer';
import { Clock, systemClock } from '@infermesh/clock';
import { DrainSweeper } from './drain-sweeper';
import { ModelCatalog } from './model-catalog';
import { ModelStore } from './model-store';
import { EmbeddedModelStore } from './model-store.embedded';
import { RedisModelStore } from './model-store.redis';
import { ModelWatch } from './model-watch';
import { ModelDerivation } from './model-derivation';
import { OnnxRuntime } from './onnx-runtime.adapter';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';
import { RegistryGrpcController } from './registry.grpc';
import { InstancesGrpcController } from './instances.grpc';
import { MeshControlPlane } from './mesh-control-plane';
import { AutoRollouts } from './auto-rollouts';
import { LedgerRolloutTraffic, RolloutTraffic } from './rollout-traffic';
import { PrometheusRolloutTraffic } from './rollout-traffic.prometheus';
import { EmbeddedTrafficLedger, TrafficLedger } from './traffic-ledger';
import { RedisTrafficLedger } from './traffic-ledger.redis';

/** What the registry runs with besides its configuration. */
export interface RegistryModuleOptions {
  /** The time every expiry, grace period and schedule of the registry follows; systemClock by default. */
  clock?: Clock;
}

@Module({})
export class RegistryModule {
  static forRoot(config: RegistryConfig, options: RegistryModuleOptions = {}): DynamicModule {
    return {
      module: RegistryModule,
      imports: [RuntimeModule.forRoot('registry', config.runtime)],
      providers: [
        { provide: REGISTRY_CONFIG, useValue: config },
        {
          provide: ModelStore,
          inject: [JsonLogger],
          useFactory: async (logger: JsonLogger): Promise<ModelStore> => {
            if (config.redisUrl === undefined) return new EmbeddedModelStore(config.metadataFile);
            const client = createRedisClient(config.redisUrl, logger, 'registry');
            // Start serving even when Redis is down: calls answer UNAVAILABLE until it is back.
            await waitForRedis(client, 5_000).catch((error: unknown) =>
              logger.warn('redis not ready at start-up; model calls are UNAVAILABLE until it is', {
                err: String(error),
              }),
            );
            return new RedisModelStore(client, config.redisKeyPrefix);
          },
        },
        {
          provide: TrafficLedger,
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger): TrafficLedger =>
            config.redisUrl === undefined
              ? new EmbeddedTrafficLedger()
              : new RedisTrafficLedger(
                  createRedisClient(config.redisUrl, logger, 'registry-traffic'),
                  config.redisKeyPrefix,
                ),
        },
        {
          provide: RolloutTraffic,
          inject: [TrafficLedger],
          useFactory: (ledger: TrafficLedger): RolloutTraffic =>
            config.rollouts.prometheusUrl === undefined
              ? new LedgerRolloutTraffic(ledger)
              : new PrometheusRolloutTraffic(config.rollouts.prometheusUrl),
        },
        AutoRollouts,
        { provide: ArtifactStore, useFactory: (): ArtifactStore => new FilesystemArtifactStore(config.artifactDir) },
        { provide: Clock, useValue: options.clock ?? systemClock },
        OnnxRuntime,
        ModelWatch,
        ModelCatalog,
        ModelDerivation,
        DrainSweeper,
        ArtifactTransfer,
        RegistryGrpcController,
        MeshControlPlane,
        InstancesGrpcController,
      ],
    };
  }
}
