import { tuneHeapForTensors, loadOrExit } from '@infermesh/config';
import { bootstrap, runMain } from '@infermesh/runtime';
import { InferenceExecutor } from './inference-executor';
import { ModelSync } from './model-sync';
import { loadWorkerConfig } from './worker.config';
import { workerBinding } from './worker.grpc';
import { WorkerModule } from './worker.module';

// Requests carry tensors through this service: see tuneHeapForTensors.
tuneHeapForTensors();

runMain('worker', async () => {
  const config = loadOrExit('worker', () => loadWorkerConfig(process.env));
  return bootstrap({
    module: WorkerModule.forRoot(config),
    grpc: (app) => [workerBinding(app)],
    // SERVING once the pinned models the registry names are READY.
    onListening: (app) => app.get(ModelSync).pinnedReady(),
    // NOT_SERVING (bootstrap), then new requests are refused while those running finish.
    beforeShutdown: (app) => app.get(InferenceExecutor).drain(),
  });
});
