import { type DynamicModule, Module } from '@nestjs/common';
import { RuntimeModule } from '@infermesh/runtime';
import { ArtifactCache } from './artifact-cache';
import { InferenceExecutor } from './inference-executor';
import { ModelRegistry } from './model-registry';
import { GrpcModelRegistry } from './model-registry.adapter';
import { ModelRuntime } from './model-runtime';
import { OrtModelRuntime } from './model-runtime.ort';
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
        { provide: ModelRuntime, useFactory: (): ModelRuntime => new OrtModelRuntime({ intraOpThreads: config.intraOpThreads }) },
        { provide: ArtifactCache, useFactory: () => new ArtifactCache(config.artifactDir) },
        ModelTable,
        ModelSync,
        InferenceExecutor,
        WorkerGrpcController,
      ],
    };
  }
}
