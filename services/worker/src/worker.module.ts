import { type DynamicModule, Module } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { registryWatchProvider } from '@infermesh/registry-watch';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { ArtifactCache } from './artifact-cache';
import { GpuMetrics } from './gpu-metrics';
import { InferenceExecutor } from './inference-executor';
import { ModelLifecycle } from './model-lifecycle';
import { ModelRegistry } from './model-registry';
import { GrpcModelRegistry } from './model-registry.adapter';
import { ModelRuntime } from './model-runtime';
import { ThreadsModelRuntime } from './model-runtime.threads';
import { ModelSync } from './model-sync';
import { ModelTable } from './model-table';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';
import { WorkerGrpcController } from './worker.grpc';

@Module({})
export class WorkerModule {
  static forRoot(config: WorkerConfig): DynamicModule {
    return {
      module: WorkerModule,
      imports: [RuntimeModule.forRoot('worker', config.runtime)],
      providers: [
        { provide: WORKER_CONFIG, useValue: config },
        registryWatchProvider(config.registryAddress),
        {
          provide: ModelRegistry,
          useFactory: (): ModelRegistry =>
            new GrpcModelRegistry({
              address: config.registryAddress,
              workerId: config.workerId,
              timeoutMs: config.registryTimeoutMs,
              downloadTimeoutMs: config.downloadTimeoutMs,
              maxMessageBytes: config.runtime.maxMessageBytes,
            }),
        },
        {
          provide: ModelRuntime,
          inject: [Metrics, JsonLogger, Clock],
          useFactory: (metrics: Metrics, logger: JsonLogger, clock: Clock): ModelRuntime => {
            const failures = metrics.counter(
              'execution_thread_failures_total',
              'Execution threads that died unasked or failed to restart; each is replaced.',
            );
            return new ThreadsModelRuntime({
              instancesPerModel: config.instancesPerModel,
              executionThreads: config.executionThreads,
              intraOpThreads: config.intraOpThreads,
              computeNice: config.computeNice,
              clock,
              onThreadCrash: (reason) => {
                failures.inc();
                logger.warn('execution thread failed; replacing it', { reason });
              },
              onPriorityKept: (reason) =>
                logger.warn('execution threads run at the priority of the main thread', { reason }),
            });
          },
        },
        {
          provide: ArtifactCache,
          inject: [Metrics, Clock],
          useFactory: (metrics: Metrics, clock: Clock) => {
            const evictions = metrics.counter(
              'artifact_cache_evictions_total',
              'Local artifact copies deleted to keep the cache within WORKER_ARTIFACT_CACHE_BYTES.',
            );
            return new ArtifactCache(config.artifactDir, config.artifactCacheBytes, () => evictions.inc(), clock);
          },
        },
        ModelTable,
        ModelLifecycle,
        ModelSync,
        InferenceExecutor,
        GpuMetrics,
        WorkerGrpcController,
      ],
    };
  }
}
