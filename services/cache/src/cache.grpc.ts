import { Injectable } from '@nestjs/common';
import { type CallContext, Errors, type ServiceImpl } from '@infermesh/grpc';
import type { CacheService, LookupRequest, StoreRequest } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { checkKey, ResultCache } from './result-cache';

/** gRPC transport of the cache service; Lookups carries Lookup's calls and Stores Store's (GrpcServer.add). */
@Injectable()
export class CacheGrpcController implements Omit<ServiceImpl<typeof CacheService>, 'lookups' | 'stores'> {
  constructor(private readonly cache: ResultCache) {}

  /**
   * Looks the key up; the answers the lookup carries are stored meanwhile, and the lookup answers
   * without waiting for them (a store that fails is counted, as outcome error, and lost). A malformed
   * store fails the call, before anything is stored or looked up.
   */
  async lookup(request: LookupRequest) {
    for (const store of request.stores) checkStore(store);
    for (const store of request.stores)
      void this.cache.store(store.key, store.response!, Number(store.ttlMs)).catch(() => undefined);
    const response = await this.cache.lookup(request.key);
    return response === undefined ? { found: false } : { found: true, response };
  }

  async store(request: StoreRequest) {
    checkStore(request);
    return { stored: await this.cache.store(request.key, request.response!, Number(request.ttlMs)) };
  }

  async *watchKeys(_request: unknown, ctx: CallContext) {
    const keys = this.cache.keys;
    if (keys === undefined) {
      throw Errors.notImplemented(
        'this cache keeps its results in Redis, shared with other processes, and cannot say which keys it holds; look each key up',
      );
    }
    yield* keys.watch(ctx.signal);
  }
}

function checkStore(request: StoreRequest): void {
  if (request.response === undefined) throw Errors.invalidRequest('store needs a response');
  checkKey(request.key);
}
