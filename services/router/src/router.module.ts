import { type DynamicModule, Module } from '@nestjs/common';
import { registryWatchProvider } from '@infermesh/registry-watch';
import { ModelLabels } from '@infermesh/telemetry';
import { RuntimeModule } from '@infermesh/runtime';
import { GuardedBatcher } from './guarded-batcher';
import { InferenceRouter } from './inference-router';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { RouterGrpcController } from './router.grpc';
import { ShadowTraffic } from './shadow-traffic';
import { TrafficReporter } from './traffic-reporter';
import { BatcherAdapter, CacheAdapter, RegistryAdapter } from './upstreams.adapter';
import { VersionResolver } from './version-resolver';

@Module({})
export class RouterModule {
  static forRoot(config: RouterConfig): DynamicModule {
    return {
      module: RouterModule,
      imports: [RuntimeModule.forRoot('router', config.runtime)],
      providers: [
        { provide: ROUTER_CONFIG, useValue: config },
        RegistryAdapter,
        registryWatchProvider(config.upstreams.registry),
        CacheAdapter,
        BatcherAdapter,
        GuardedBatcher,
        TrafficReporter,
        ShadowTraffic,
        VersionResolver,
        // Model and version names become metric labels only when registered: known to the resolver.
        {
          provide: ModelLabels,
          inject: [VersionResolver],
          useFactory: (resolver: VersionResolver) => new ModelLabels(resolver),
        },
        InferenceRouter,
        RouterGrpcController,
      ],
    };
  }
}
