import { type DynamicModule, Module } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { createRedisClient } from '@infermesh/redis';
import { RuntimeModule } from '@infermesh/runtime';
import { JsonLogger } from '@infermesh/telemetry';
import { CACHE_CONFIG, type CacheConfig } from './cache.config';
import { CacheGrpcController } from './cache.grpc';
import { ResultCache } from './result-cache';
import { ResultStore } from './result-store';
import { EmbeddedResultStore } from './result-store.embedded';
import { RedisResultStore } from './result-store.redis';

@Module({})
export class CacheModule {
  static forRoot(config: CacheConfig): DynamicModule {
    return {
      module: CacheModule,
      imports: [RuntimeModule.forRoot('cache', config.runtime)],
      providers: [
        { provide: CACHE_CONFIG, useValue: config },
        {
          provide: ResultStore,
          inject: [JsonLogger, Clock],
          useFactory: (logger: JsonLogger, clock: Clock): ResultStore =>
            config.redisUrl === undefined
              ? new EmbeddedResultStore(config.maxBytes, clock)
              : new RedisResultStore(createRedisClient(config.redisUrl, logger, 'cache'), config.redisKeyPrefix),
        },
        ResultCache,
        CacheGrpcController,
      ],
    };
  }
}
