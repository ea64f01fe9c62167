import { tuneHeapForTensors, loadOrExit } from '@infermesh/config';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { loadBatcherConfig } from './batcher.config';
import { BatcherGrpcController } from './batcher.grpc';
import { BatcherModule } from './batcher.module';

// Requests carry tensors through this service: see tuneHeapForTensors.
tuneHeapForTensors();

runMain('batcher', async () => {
  const config = loadOrExit('batcher', () => loadBatcherConfig(process.env));
  return bootstrap({
    module: BatcherModule.forRoot(config),
    grpc: (app) => [bind(BatcherService, app.get(BatcherGrpcController), { infers: 'infer' })],
  });
});
