import { type DynamicModule, type MiddlewareConsumer, Module, type NestModule } from '@nestjs/common';
import { APP_FILTER, APP_GUARD } from '@nestjs/core';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger } from '@infermesh/telemetry';
import { ApiKeyAuth } from './api-key-auth';
import { ApiKeyGuard } from './api-key.guard';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';
import { GatewayGrpcController } from './gateway.grpc';
import { GatewayHttpController } from './gateway.http';
import { GatewayMetrics } from './gateway-metrics';
import { HttpErrorFilter } from './http-error.filter';
import { ModelCatalog } from './model-catalog';
import { ModelInference } from './model-inference';
import { RegistryClient } from './registry.client';
import { RequestTracking } from './request-tracking.middleware';
import { RouterClient } from './router.client';
import { ServerStatus } from './server-status';
import { UpstreamHealth } from './upstream-health';

@Module({})
export class GatewayModule implements NestModule {
  static forRoot(config: GatewayConfig): DynamicModule {
    const maxMessageBytes = config.runtime.maxMessageBytes;
    return {
      module: GatewayModule,
      imports: [RuntimeModule.forRoot('gateway', config.runtime)],
      controllers: [GatewayHttpController],
      providers: [
        { provide: GATEWAY_CONFIG, useValue: config },
        {
          provide: RouterClient,
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger) => new RouterClient(config.routerAddress, maxMessageBytes, logger),
        },
        {
          provide: RegistryClient,
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger) => new RegistryClient(config.registryAddress, maxMessageBytes, logger),
        },
        {
          provide: UpstreamHealth,
          useFactory: () =>
            new UpstreamHealth({
              upstreams: { router: config.routerAddress, registry: config.registryAddress },
              timeoutMs: config.upstreamProbeTimeoutMs,
              cacheMs: config.upstreamProbeCacheMs,
            }),
        },
        GatewayMetrics,
        ApiKeyAuth,
        ModelCatalog,
        ModelInference,
        ServerStatus,
        GatewayGrpcController,
        // Registered as providers, not in bootstrap's configure (which runs after app.init(), too late for both).
        { provide: APP_GUARD, useClass: ApiKeyGuard },
        { provide: APP_FILTER, useClass: HttpErrorFilter },
      ],
    };
  }

  configure(consumer: MiddlewareConsumer): void {
    consumer.apply(RequestTracking).forRoutes('*');
  }
}
