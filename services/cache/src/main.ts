import { loadOrExit } from '@infermesh/config';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { bind, bootstrap, runMain } from '@infermesh/runtime';
import { loadCacheConfig } from './cache.config';
import { CacheGrpcController } from './cache.grpc';
import { CacheModule } from './cache.module';

runMain('cache', async () => {
  const config = loadOrExit('cache', () => loadCacheConfig(process.env));
  return bootstrap({
    module: CacheModule.forRoot(config),
    grpc: (app) => [bind(CacheService, app.get(CacheGrpcController), { lookups: 'lookup', stores: 'store' })],
  });
});
