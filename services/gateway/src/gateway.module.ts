import { type DynamicModule, type MiddlewareConsumer, Module, type NestModule } from '@nestjs/common';
import { APP_FILTER, APP_GUARD } from '@nestjs/core';
import { Clock, systemClock } from '@infermesh/clock';
import { RateLimiter } from '@infermesh/rate-limit';
import { createRedisClient, waitForRedis } from '@infermesh/redis';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger } from '@infermesh/telemetry';
import { ApiKeyAuth } from './auth/api-key-auth';
import { ApiKeyGuard } from './auth/api-key.guard';
import { ApiKeys } from './auth/api-keys/api-keys';
import type { ApiKeyStore } from './auth/api-keys/api-key-store';
import { EmbeddedApiKeyStore } from './auth/api-keys/api-key-store.embedded';
import { RedisApiKeyStore } from './auth/api-keys/api-key-store.redis';
import { ApiKeysAdmin } from './admin/api-keys-admin';
import { ApiKeysAdminGrpcController } from './admin/api-keys-admin.grpc';
import { ApiKeysAdminHttpController } from './admin/api-keys-admin.http';
import { BodyBudget } from './requests/body-budget';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';
import { GatewayGrpcController } from './inference/gateway.grpc';
import { GatewayHttpController } from './inference/gateway.http';
import { GatewayMetrics } from './gateway-metrics';
import { HttpErrorFilter } from './requests/http-error.filter';
import { ModelLookup } from './inference/model-lookup';
import { ModelInference } from './inference/model-inference';
import { createRateLimiter, RateLimits } from './auth/rate-limits';
import { RegistryClient } from './upstreams/registry.client';
import { RegistryAdminGrpcController } from './admin/registry-admin.grpc';
import { RegistryAdminHttpController } from './admin/registry-admin.http';
import { RequestTracking } from './requests/request-tracking.middleware';
import { RouterClient } from './upstreams/router.client';
import { ServerStatus } from './server-status';
import { UpstreamHealth } from './upstreams/upstream-health.client';

/** What a gateway runs on besides its configuration. */
export interface GatewayOptions {
  /** Time and timers: systemClock unless given (specs give a ManualClock). */
  clock?: Clock;
}

@Module({})
export class GatewayModule implements NestModule {
  static forRoot(config: GatewayConfig, options: GatewayOptions = {}): DynamicModule {
    const maxMessageBytes = config.runtime.maxMessageBytes;
    return {
      module: GatewayModule,
      imports: [RuntimeModule.forRoot('gateway', config.runtime)],
      controllers: [GatewayHttpController, RegistryAdminHttpController, ApiKeysAdminHttpController],
      providers: [
        { provide: GATEWAY_CONFIG, useValue: config },
        { provide: Clock, useValue: options.clock ?? systemClock },
        {
          provide: RouterClient,
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger) =>
            new RouterClient(config.routerAddress, maxMessageBytes, logger, config.routerCarried),
        },
        {
          provide: RegistryClient,
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger) => new RegistryClient(config.registryAddress, maxMessageBytes, logger),
        },
        {
          provide: UpstreamHealth,
          inject: [Clock],
          useFactory: (clock: Clock) =>
            new UpstreamHealth({
              upstreams: { router: config.routerAddress, registry: config.registryAddress },
              timeoutMs: config.upstreamProbeTimeoutMs,
              cacheMs: config.upstreamProbeCacheMs,
              clock,
            }),
        },
        {
          provide: ApiKeys,
          inject: [JsonLogger, Clock],
          useFactory: async (logger: JsonLogger, clock: Clock) =>
            new ApiKeys(await openApiKeyStore(config, logger), { cacheMs: config.apiKeyCacheMs, clock }),
        },
        {
          provide: RateLimiter,
          inject: [JsonLogger, GatewayMetrics, Clock],
          useFactory: (logger: JsonLogger, metrics: GatewayMetrics, clock: Clock) =>
            createRateLimiter(config, logger, metrics, clock),
        },
        GatewayMetrics,
        BodyBudget,
        ApiKeyAuth,
        ApiKeysAdmin,
        RateLimits,
        ModelLookup,
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
