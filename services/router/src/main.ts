import { tuneHeapForTensors, loadOrExit } from '@infermesh/config';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { loadRouterConfig } from './router.config';
import { RouterGrpcController } from './router.grpc';
import { RouterModule } from './router.module';

// Requests carry tensors through this service: see tuneHeapForTensors.
tuneHeapForTensors();

runMain('router', async () => {
  const config = loadOrExit('router', () => loadRouterConfig(process.env));
  return bootstrap({
    module: RouterModule.forRoot(config),
    grpc: (app) => [bind(RouterService, app.get(RouterGrpcController), { infers: 'infer' })],
  });
});
