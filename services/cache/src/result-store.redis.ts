import type { Redis } from '@infermesh/redis';
import { ResultStore } from './result-store';

/** Results in Redis as plain keys with a PX expiry; eviction follows Redis's maxmemory policy. */
export class RedisResultStore extends ResultStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    super();
  }

  async get(key: Buffer): Promise<Buffer | undefined> {
    const value = await this.redis.getBuffer(this.redisKey(key));
    return value ?? undefined;
  }

  async set(key: Buffer, value: Buffer, ttlMs: number): Promise<void> {
    await this.redis.set(this.redisKey(key), value, 'PX', ttlMs);
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }

  private redisKey(key: Buffer): string {
    return this.prefix + key.toString('hex');
  }
}
