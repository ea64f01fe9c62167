import { type Clock, systemClock } from '@infermesh/clock';
import type { MeshInstance } from '@infermesh/mesh';
import type { Redis } from '@infermesh/redis';
import type { JsonLogger } from '@infermesh/telemetry';
import type { MeshInstances, RemoteInstance } from './mesh-instances';

/** One instance as a replica of the registry shares it: who holds its announcement, and until when it counts. */
interface SharedEntry {
  instance: MeshInstance;
  /** The replica whose Announce stream it is on. */
  holder: string;
  announcedAtMs: number;
  expiresAtMs: number;
}

/**
 * Writes entries (id, value, announcedAtMs triples), each unless the hash holds a newer announcement of
 * that id (the instance restarted and announced itself to another replica): the newer stays.
 */
const WRITE_UNLESS_NEWER = `
for i = 1, #ARGV, 3 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local newer = false
  if current then
    local ok, entry = pcall(cjson.decode, current)
    newer = ok and type(entry) == 'table' and type(entry.announcedAtMs) == 'number' and entry.announcedAtMs > tonumber(ARGV[i + 2])
  end
  if not newer then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1`;

/** Deletes a field only if it still holds the value read (a newer write by another replica stays). */
const DELETE_IF_UNCHANGED = `if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0`;

function parseEntry(text: string): SharedEntry | undefined {
  try {
    const entry = JSON.parse(text) as Partial<SharedEntry>;
    if (
      typeof entry.holder !== 'string' ||
      typeof entry.expiresAtMs !== 'number' ||
      typeof entry.announcedAtMs !== 'number' ||
      typeof entry.instance?.id !== 'string'
    )
      return undefined;
    return entry as SharedEntry;
  } catch {
    return undefined;
  }
}

/**
 * Shares the mesh's instances between the replicas of the registry through Redis, so that each
 * replica serves every sidecar the endpoints of every instance, whichever replica it announced
 * itself to. Each replica writes the instances announced to it into one hash (field: instance id),
 * each with an expiry a heartbeat period ahead, refreshed while the announcement lasts and removed
 * when it ends; and reads the others' back every `pollMs`. A replica that dies leaves entries that
 * expire within the instance timeout, as a silent instance does on one replica. While Redis is
 * unreachable each replica goes on with what it last read, until that expires too.
 */
export class RedisInstanceMirror {
  private readonly key: string;
  private stopPolling: (() => void) | undefined;
  /** The entries this replica last wrote, by instance id: what it removes when they go. */
  private written = new Map<string, string>();
  /** While the others' instances are being applied: the change that makes is not this replica's to write. */
  private applyingRemote = false;
  private running: Promise<void> | undefined;
  private again = false;
  private failing = false;
  private readonly unsubscribe: () => void;

  constructor(
    private readonly instances: MeshInstances,
    private readonly redis: Redis,
    keyPrefix: string,
    /** This replica's name: unique among the registry's replicas (its instance id). */
    private readonly holder: string,
    /** How long an entry counts after its last refresh: the instance timeout. */
    private readonly ttlMs: number,
    private readonly pollMs: number,
    private readonly logger: JsonLogger,
    private readonly clock: Clock = systemClock,
  ) {
    this.key = `${keyPrefix}mesh:instances`;
    this.unsubscribe = instances.onChange(() => {
      if (!this.applyingRemote) this.syncSoon();
    });
  }

  start(): void {
    this.stopPolling = this.clock.setRepeatingTimer(() => this.syncSoon(), this.pollMs);
    this.syncSoon();
  }

  /** Resolves once no sync runs or waits to run: what this replica holds is written, and the others' read. */
  async settled(): Promise<void> {
    while (this.running !== undefined) await this.running;
  }

  /** Stops sharing and takes this replica's instances out of the hash (they announce again elsewhere). */
  async stop(): Promise<void> {
    this.stopPolling?.();
    this.unsubscribe();
    await this.settled();
    await Promise.all(
      [...this.written].map(([id, value]) =>
        this.redis.eval(DELETE_IF_UNCHANGED, 1, this.key, id, value).catch(() => undefined),
      ),
    );
    this.written.clear();
  }

  /** One sync at a time; a change during one makes another right after. */
  private syncSoon(): void {
    if (this.running !== undefined) {
      this.again = true;
      return;
    }
    this.running = this.sync()
      .catch((error: unknown) => {
        if (!this.failing)
          this.logger.warn('cannot share the mesh instances through Redis; going on with those last read', {
            err: String(error),
          });
        this.failing = true;
      })
      .finally(() => {
        this.running = undefined;
        if (this.again) {
          this.again = false;
          this.syncSoon();
        }
      });
  }

  private async sync(): Promise<void> {
    const now = this.clock.now();
    // What this replica holds, each entry's expiry a timeout ahead of its last heartbeat here.
    const mine = new Map<string, string>();
    const args: string[] = [];
    for (const { instance, announcedAtMs, lastSeenMs } of this.instances.local()) {
      const value = JSON.stringify({
        instance,
        holder: this.holder,
        announcedAtMs,
        expiresAtMs: lastSeenMs + this.ttlMs,
      } satisfies SharedEntry);
      mine.set(instance.id, value);
      args.push(instance.id, value, String(announcedAtMs));
    }
    const gone = [...this.written].filter(([id]) => !mine.has(id));
    if (args.length > 0) await this.redis.eval(WRITE_UNLESS_NEWER, 1, this.key, ...args);
    for (const [id, value] of gone) await this.redis.eval(DELETE_IF_UNCHANGED, 1, this.key, id, value);
    this.written = mine;

    const all = await this.redis.hgetall(this.key);
    const remote: RemoteInstance[] = [];
    for (const [id, text] of Object.entries(all)) {
      const entry = parseEntry(text);
      if (entry === undefined || entry.expiresAtMs <= now) {
        // Expired (its replica died) or unreadable: whoever sees it first removes it.
        await this.redis.eval(DELETE_IF_UNCHANGED, 1, this.key, id, text);
        continue;
      }
      if (entry.holder !== this.holder)
        remote.push({ instance: entry.instance, announcedAtMs: entry.announcedAtMs, expiresAtMs: entry.expiresAtMs });
    }
    if (this.failing) this.logger.info('sharing the mesh instances through Redis again');
    this.failing = false;
    this.applyingRemote = true;
    try {
      this.instances.setRemote(remote);
    } finally {
      this.applyingRemote = false;
    }
  }
}
