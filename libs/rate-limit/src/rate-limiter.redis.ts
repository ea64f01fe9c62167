import type { Redis } from '@infermesh/redis';
import { type Bucket, type Decision, RateLimiter } from './rate-limiter';

/**
 * The token-bucket arithmetic of takeTokens (rate-limiter.ts), run atomically inside Redis so that
 * every replica draws from the same buckets. The clock is Redis's own (TIME), so replicas whose
 * clocks differ still agree. KEYS: the buckets; ARGV: rate per ms and burst of each bucket.
 * Returns {allowed (1|0), retry after ms, index of the limiting bucket (1-based, 0 when allowed)}.
 */
const TAKE_SCRIPT = `
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local n = #KEYS
local tokens = {}
local wait = 0
local limited = 0
for i = 1, n do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'updated')
  local current = tonumber(state[1])
  local updated = tonumber(state[2])
  if current == nil or updated == nil then
    current = burst
    updated = now
  end
  current = math.min(burst, current + math.max(0, now - updated) * rate)
  tokens[i] = current
  if current < 1 then
    local w = math.ceil((1 - current) / rate)
    if w >= wait then
      wait = w
      limited = i
    end
  end
end
for i = 1, n do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  if limited == 0 then tokens[i] = tokens[i] - 1 end
  redis.call('HSET', KEYS[i], 'tokens', tostring(tokens[i]), 'updated', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil((burst - tokens[i]) / rate) + 1000)
end
if limited == 0 then return {1, 0, 0} end
return {0, wait, limited}
`;

/**
 * Token buckets in Redis, shared by every gateway replica: one script call per request checks and
 * takes from all of its buckets atomically. Keys are `<prefix>{<scope>}:<bucket key>`, so the buckets
 * of one scope share a Redis Cluster slot; a bucket expires once
 * it would be full again, so idle callers cost no memory.
 */
export class RedisRateLimiter extends RateLimiter {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    super();
    if (typeof (redis as unknown as { takeTokens?: unknown }).takeTokens !== 'function') {
      redis.defineCommand('takeTokens', { lua: TAKE_SCRIPT });
    }
  }

  async take(scope: string, buckets: readonly Bucket[]): Promise<Decision> {
    if (buckets.length === 0) return { allowed: true, retryAfterMs: 0 };
    const keys = buckets.map((b) => `${this.prefix}{${scope}}:${b.key}`);
    const args = buckets.flatMap((b) => [String(b.ratePerS / 1000), String(b.burst)]);
    const [allowed, retryAfterMs, limited] = (await (this.redis as unknown as ScriptCommands).takeTokens(
      keys.length,
      ...keys,
      ...args,
    )) as [number, number, number];
    if (allowed === 1) return { allowed: true, retryAfterMs: 0 };
    return { allowed: false, retryAfterMs, limitedBy: buckets[limited - 1]?.key ?? '' };
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }
}

interface ScriptCommands {
  takeTokens(numberOfKeys: number, ...keysAndArgs: string[]): Promise<unknown>;
}
