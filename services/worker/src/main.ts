import { loadOrExit } from '@infermesh/config';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { InferenceExecutor } from './inference-executor';
import { ModelSync } from './model-sync';
import { loadWorkerConfig } from './worker.config';
import { WorkerGrpcController } from './worker.grpc';
import { WorkerModule } from './worker.module';
import { setFlagsFromString } from 'node:v8';

// Each call hands the main thread a few ArrayBuffers the size of its tensors (the request as
// received, the copy for the execution thread, the outputs, the encoded answer). By default V8 runs a
// full mark-compact of the whole heap whenever such external memory has grown by 64 MiB since the
// last one, whatever the heap holds: about every 170 calls of 32 MLP rows, and 1 ms of CPU a call in
// V8's helper threads. Counted within the heap's global limit instead, the worker's CPU per call at
// batch 32 with 4 in flight falls by 14 to 38 % and its items/s rise by 20 to 40 % (`npm run bench --
// quantization`), for about 80 MiB more resident memory under that load. V8 reads the flag when it
// sets its limits, so setting it here, before any load, takes effect in every thread.
setFlagsFromString('--external-memory-accounted-in-global-limit');

runMain('worker', async () => {
  const config = loadOrExit('worker', () => loadWorkerConfig(process.env));
  return bootstrap({
    module: WorkerModule.forRoot(config),
    grpc: (app) => [bind(WorkerService, app.get(WorkerGrpcController))],
    // SERVING once the pinned models the registry names are READY.
    onListening: (app) => app.get(ModelSync).pinnedReady(),
    // NOT_SERVING (bootstrap), then new requests are refused while those running finish.
    beforeShutdown: (app) => app.get(InferenceExecutor).drain(),
  });
});
