import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import type { JsonLogger } from '@infermesh/telemetry';
import { type RedisServer, startRedisServer } from '@infermesh/testing';
import { RedisModelStore } from './model-store.redis';

/**
 * For specs: Redis model stores on a redis-server of their own, each store with its own client (as
 * registry replicas sharing one Redis have). start() before the first, stop() after the last.
 */
export class RedisModelStores {
  private server: RedisServer | undefined;
  private readonly clients: Redis[] = [];

  constructor(private readonly logger: JsonLogger) {}

  async start(): Promise<void> {
    this.server = await startRedisServer();
  }

  /** A store under `prefix`; stores opened with the same prefix share their models. */
  async open(prefix: string): Promise<RedisModelStore> {
    if (this.server === undefined) throw new Error('RedisModelStores.open before start');
    const client = createRedisClient(this.server.url, this.logger, 'test');
    this.clients.push(client);
    await waitForRedis(client, 5_000);
    return new RedisModelStore(client, prefix);
  }

  async stop(): Promise<void> {
    for (const client of this.clients.splice(0)) if (client.status !== 'end') client.disconnect();
    await this.server?.stop();
  }
}
