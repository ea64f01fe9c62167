import { loadOrExit } from '@infermesh/config';
import { InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { InstancesGrpcController } from './instances.grpc';
import { MeshControlPlane } from './mesh-control-plane';
import { ModelWatch } from './model-watch';
import { loadRegistryConfig } from './registry.config';
import { RegistryGrpcController } from './registry.grpc';
import { RegistryModule } from './registry.module';

runMain('registry', async () => {
  const config = loadOrExit('registry', () => loadRegistryConfig(process.env));
  return bootstrap({
    module: RegistryModule.forRoot(config),
    grpc: (app) => [
      bind(RegistryService, app.get(RegistryGrpcController)),
      bind(InstanceService, app.get(InstancesGrpcController)),
    ],
    // The mesh's xDS (ADS), in Envoy's own messages, when a policy file is configured.
    untypedGrpc: (app) => app.get(MeshControlPlane).xdsService(),
    // Its own authorization comes from the policy it serves, not over xDS from itself.
    inboundListener: (app) => app.get(MeshControlPlane).ownInboundSource(),
    // WatchModels streams last until the follower leaves: end them, so that shutdown need not wait.
    beforeShutdown: (app) => void app.get(ModelWatch).close(),
  });
});
