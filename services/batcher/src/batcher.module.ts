import { type DynamicModule, Module } from '@nestjs/common';
import { Clock, systemClock } from '@infermesh/clock';
import { registryWatchProvider } from '@infermesh/registry-watch';
import { RuntimeModule } from '@infermesh/runtime';
import { AdmissionControl } from './admission-control';
import { BatchExecutor } from './batch-executor';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';
import { BatcherGrpcController } from './batcher.grpc';
import { DynamicBatchScheduler } from './dynamic-batch-scheduler';
import { REPLICA_CHOICE, replicaChoice } from './replica-choice';
import { Scheduler } from './scheduler';
import { SchedulerMetrics } from './scheduler-metrics';
import { VersionQueues } from './version-queues';
import { VersionSettings } from './version-settings';
import { WorkerPool } from './worker-pool';

/** What the batcher runs with besides its configuration. */
export interface BatcherModuleOptions {
  /** The time that deadlines, queue delays, retry back-off, polls and ejections follow; systemClock by default. */
  clock?: Clock;
}

@Module({})
export class BatcherModule {
  static forRoot(config: BatcherConfig, options: BatcherModuleOptions = {}): DynamicModule {
    return {
      module: BatcherModule,
      imports: [RuntimeModule.forRoot('batcher', config.runtime)],
      providers: [
        { provide: BATCHER_CONFIG, useValue: config },
        { provide: Clock, useValue: options.clock ?? systemClock },
        registryWatchProvider(config.registryAddress),
        WorkerPool,
        VersionSettings,
        VersionQueues,
        SchedulerMetrics,
        AdmissionControl,
        { provide: REPLICA_CHOICE, useValue: replicaChoice(config.replicaChoice) },
        BatchExecutor,
        { provide: Scheduler, useClass: DynamicBatchScheduler },
        BatcherGrpcController,
      ],
    };
  }
}
