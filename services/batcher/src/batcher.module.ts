import { type DynamicModule, Module } from '@nestjs/common';
import { registryWatchProvider } from '@infermesh/registry-watch';
import { RuntimeModule } from '@infermesh/runtime';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import { BatcherGrpcController } from './batcher.grpc';
import { Scheduler } from './scheduler';
import { VersionSettings } from './version-settings';
import { WorkerPool } from './worker-pool';

@Module({})
export class BatcherModule {
  static forRoot(config: BatcherConfig): DynamicModule {
    return {
      module: BatcherModule,
      imports: [RuntimeModule.forRoot('batcher', config.runtime)],
      providers: [
        { provide: BATCHER_CONFIG, useValue: config },
        registryWatchProvider(config.registryAddress),
        WorkerPool,
        VersionSettings,
        Scheduler,
        BatcherGrpcController,
      ],
    };
  }
}
