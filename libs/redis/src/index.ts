import Redis from 'ioredis';
import { type Clock, systemClock } from '@infermesh/clock';
import type { JsonLogger } from '@infermesh/telemetry';

export type { Redis };

/**
 * An ioredis client for a store: commands fail fast while Redis is unreachable (no offline queue,
 * one retry per request) so that callers can fail open or answer UNAVAILABLE instead of hanging,
 * and the connection keeps being re-established in the background.
 */
export function createRedisClient(url: string, logger: JsonLogger, name: string): Redis {
  const client = new Redis(url, {
    connectionName: `infermesh-${name}`,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    connectTimeout: 2_000,
    commandTimeout: 2_000,
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 2_000),
    lazyConnect: false,
  });
  let lastError = '';
  client.on('error', (error: Error) => {
    if (error.message !== lastError) logger.warn(`redis (${name}) error`, { err: error.message });
    lastError = error.message;
  });
  client.on('ready', () => {
    if (lastError !== '') logger.info(`redis (${name}) reconnected`);
    lastError = '';
  });
  return client;
}

/** Resolves once the client is ready, or rejects after timeoutMs (on `clock`, systemClock unless given). */
export async function waitForRedis(client: Redis, timeoutMs: number, clock: Clock = systemClock): Promise<void> {
  if (client.status === 'ready') return;
  await new Promise<void>((resolve, reject) => {
    const cancel = clock.setTimer(() => {
      client.off('ready', onReady);
      reject(new Error(`redis not ready after ${timeoutMs} ms (status ${client.status})`));
    }, timeoutMs);
    const onReady = () => {
      cancel();
      resolve();
    };
    client.once('ready', onReady);
  });
}
