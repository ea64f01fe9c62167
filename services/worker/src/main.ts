import { loadOrExit } from '@infermesh/config';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { loadWorkerConfig } from './worker.config';
import { WorkerGrpcController } from './worker.grpc';
import { WorkerModule } from './worker.module';

runMain('worker', async () => {
  const config = loadOrExit('worker', () => loadWorkerConfig(process.env));
  return bootstrap({
    module: WorkerModule.forRoot(config),
    grpc: (app) => [bind(WorkerService, app.get(WorkerGrpcController))],
  });
});
