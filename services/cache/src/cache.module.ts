import { type DynamicModule, Module } from '@nestjs/common';
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
          inject: [JsonLogger],
          useFactory: (logger: JsonLogger): ResultStore =>
            config.redisUrl === undefined
              ? new EmbeddedResultStore(config.maxBytes)
              : new RedisResultStore(createRedisClient(config.redisUrl, logger, 'cache'), config.redisKeyPrefix),
        },
        ResultCache,
        CacheGrpcController,
      ],
    };
  }
}
