import { Errors } from '@infermesh/grpc';

/**
 * CacheService.WatchKeys of a fake cache service that cannot say which keys it holds, as one backed by
 * Redis answers: UNIMPLEMENTED, so that routers look every key up.
 */
export async function* unlistedKeys(): AsyncGenerator<never> {
  throw Errors.notImplemented('this cache cannot say which keys it holds; look each key up');
}
