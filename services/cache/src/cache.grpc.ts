import { Injectable } from '@nestjs/common';
import type { ServiceImpl } from '@infermesh/grpc';
import type { CacheService, LookupRequest, StoreRequest } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { RpcError } from '@infermesh/grpc';
import { ResultCache } from './result-cache';

/** gRPC transport of the cache service. */
@Injectable()
export class CacheGrpcController implements ServiceImpl<typeof CacheService> {
  constructor(private readonly cache: ResultCache) {}

  async lookup(request: LookupRequest) {
    const response = await this.cache.lookup(request.key);
    return response === undefined ? { found: false } : { found: true, response };
  }

  async store(request: StoreRequest) {
    if (request.response === undefined) throw RpcError.invalidArgument('store needs a response');
    return { stored: await this.cache.store(request.key, request.response, Number(request.ttlMs)) };
  }
}
