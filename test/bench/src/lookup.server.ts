import { GrpcServer } from '@infermesh/grpc';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { unlistedKeys } from '@infermesh/testing';

/**
 * The server side of the carried bench: a GrpcServer hosting CacheService as the cache service does
 * (Lookups carrying Lookup), whose lookups find nothing at once, so that what is measured is the
 * transport and the library around it. Sends its port to the parent over IPC; ends when the parent
 * disconnects.
 */
async function main(): Promise<void> {
  const server = new GrpcServer({
    logger: new JsonLogger('lookup-bench', 'error'),
    metrics: new Metrics('lookup_bench'),
    maxMessageBytes: 64 << 20,
  });
  server.add(
    CacheService,
    { lookup: async () => ({ found: false }), store: async () => ({ stored: false }), watchKeys: unlistedKeys },
    { lookups: 'lookup', stores: 'store' },
  );
  const port = await server.listen('127.0.0.1', 0);
  process.send?.({ port });
  process.on('disconnect', () => {
    void server.shutdown(0).then(() => process.exit(0));
  });
}

void main();
