import type { NestExpressApplication } from '@nestjs/platform-express';
import { GRPCInferenceService } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { bind, bootstrap, type RunningService } from '@infermesh/runtime';
import type { GatewayConfig } from './gateway.config';
import { GatewayGrpcController } from './gateway.grpc';
import { GatewayModule } from './gateway.module';

/** Starts the gateway: REST on the HTTP port, GRPCInferenceService on the gRPC port. */
export function startGateway(config: GatewayConfig): Promise<RunningService> {
  return bootstrap({
    module: GatewayModule.forRoot(config),
    grpc: (app) => [bind(GRPCInferenceService, app.get(GatewayGrpcController))],
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
