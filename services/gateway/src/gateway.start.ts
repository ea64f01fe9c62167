import type { NestExpressApplication } from '@nestjs/platform-express';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { GRPCInferenceService } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { bind, bootstrap, type RunningService } from '@infermesh/runtime';
import { ApiKeysAdminGrpcController } from './admin/api-keys-admin.grpc';
import type { GatewayConfig } from './gateway.config';
import { GatewayGrpcController } from './inference/gateway.grpc';
import { GatewayModule, type GatewayOptions } from './gateway.module';
import { RegistryAdminGrpcController } from './admin/registry-admin.grpc';
import { ServerReflectionGrpcController } from './server-reflection';

/**
 * Starts the gateway: REST on the HTTP port; on the gRPC port GRPCInferenceService and, for
 * administrators, the registry's RegistryService and the gateway's own ApiKeyService, with server
 * reflection (open to all) describing them.
 */
export function startGateway(config: GatewayConfig, options: GatewayOptions = {}): Promise<RunningService> {
  return bootstrap({
    module: GatewayModule.forRoot(config, options),
    // The public API: clients outside the mesh, each call checked by its API key.
    publicGrpc: true,
    grpcLimits: config.grpc,
    grpc: (app) => {
      const api = [
        bind(GRPCInferenceService, app.get(GatewayGrpcController)),
        bind(RegistryService, app.get(RegistryAdminGrpcController)),
        bind(ApiKeyService, app.get(ApiKeysAdminGrpcController)),
      ];
      // bootstrap hosts grpc.health.v1.Health on every gRPC port; reflection lists it with the rest.
      const reflection = new ServerReflectionGrpcController([Health, ...api.map((binding) => binding.service)]);
      return [...api, ...reflection.bindings()];
    },
    // Inference beyond the concurrency limit is refused before its message is read.
    shed: (app) => {
      const controller = app.get(GatewayGrpcController);
      return (path) => controller.refuseEarly(path);
    },
    http: {
      host: config.http.host,
      port: config.http.port,
      configure: (app) => {
        const express = (app as NestExpressApplication).getHttpAdapter().getInstance();
        express.disable('x-powered-by');
        express.set('etag', false); // no hashing of large inference responses
      },
    },
  });
}
