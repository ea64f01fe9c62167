import { type DynamicModule, type MiddlewareConsumer, Module, type NestModule } from '@nestjs/common';
import { APP_FILTER, APP_GUARD } from '@nestjs/core';
import { RateLimiter } from '@infermesh/rate-limit';
import { createRedisClient, waitForRedis } from '@infermesh/redis';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger } from '@infermesh/telemetry';
import { ApiKeyAuth } from './api-key-auth';
import { ApiKeyGuard } from './api-key.guard';
import { ApiKeys } from './api-keys/api-keys';
import type { ApiKeyStore } from './api-keys/api-key-store';
import { EmbeddedApiKeyStore } from './api-keys/api-key-store.embedded';
import { RedisApiKeyStore } from './api-keys/api-key-store.redis';
import { ApiKeysAdmin } from './api-keys-admin';
import { ApiKeysAdminGrpcController } from './api-keys-admin.grpc';
import { ApiKeysAdminHttpController } from './api-keys-admin.http';
import { BodyBudget } from './body-budget';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';
import { GatewayGrpcController } from './gateway.grpc';
import { GatewayHttpController } from './gateway.http';
import { GatewayMetrics } from './gateway-metrics';
import { HttpErrorFilter } from './http-error.filter';
import { ModelCatalog } from './model-catalog';
import { ModelInference } from './model-inference';
import { createRateLimiter, RateLimits } from './rate-limits';
import { RegistryClient } from './registry.client';
import { RegistryAdminGrpcController } from './registry-admin.grpc';
import { RegistryAdminHttpController } from './registry-admin.http';
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
      controllers: [GatewayHttpController, RegistryAdminHttpController, ApiKeysAdminHttpController],
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
        {
          provide: ApiKeys,
          inject: [JsonLogger],
          useFactory: async (logger: JsonLogger) =>
            new ApiKeys(await openApiKeyStore(config, logger), { cacheMs: config.apiKeyCacheMs }),
        },
        {
          provide: RateLimiter,
          inject: [JsonLogger, GatewayMetrics],
          useFactory: (logger: JsonLogger, metrics: GatewayMetrics) => createRateLimiter(config, logger, metrics),
        },
        GatewayMetrics,
        BodyBudget,
        ApiKeyAuth,
        ApiKeysAdmin,
        RateLimits,
        ModelCatalog,
        ModelInference,
        ServerStatus,
        GatewayGrpcController,
        RegistryAdminGrpcController,
        ApiKeysAdminGrpcController,
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

/**
 * The stored API keys: in Redis when REDIS_URL is set (shared by every replica; the gateway starts
 * while Redis is down, stored keys answering UNAVAILABLE until it is back), else in a file of this gateway's.
 */
async function openApiKeyStore(config: GatewayConfig, logger: JsonLogger): Promise<ApiKeyStore> {
  if (config.redisUrl === undefined) return new EmbeddedApiKeyStore(config.apiKeysFile);
  const client = createRedisClient(config.redisUrl, logger, 'gateway-api-keys');
  await waitForRedis(client, 5_000).catch((error: unknown) =>
    logger.warn('redis not ready at start-up; stored API keys are refused as UNAVAILABLE until it is', {
      err: String(error),
    }),
  );
  return new RedisApiKeyStore(client, config.redisKeyPrefix);
}
