import { type Clock, systemClock } from '@infermesh/clock';
import { MESH_SERVICES, type MeshInstance, type MeshService } from '@infermesh/mesh';

/** An instance announced to another replica of the registry, until when it counts, and since when it is announced. */
export interface RemoteInstance {
  instance: MeshInstance;
  announcedAtMs: number;
  expiresAtMs: number;
}

/** An instance as announced, and when it was last heard from. */
interface Announced {
  instance: MeshInstance;
  /** When the announcement began: of two of one id (on two replicas of the registry), the newer counts. */
  announcedAtMs: number;
  lastSeenMs: number;
  /** Identifies the announcement: a newer one of the same id replaces it, and only its own end withdraws it. */
  token: symbol;
}

/**
 * The running instances of the mesh, as they announce themselves (InstanceService.Announce): added
 * on the first message, updated by each heartbeat, withdrawn when their stream ends or goes silent
 * for `timeoutMs`. Listeners hear of every change; the xDS endpoints follow them.
 */
export class MeshInstances {
  private readonly byId = new Map<string, Announced>();
  private readonly listeners = new Set<() => void>();
  /** Instances announced to the other replicas of the registry (RedisInstanceMirror), each until it expires. */
  private remote: readonly RemoteInstance[] = [];

  constructor(
    private readonly timeoutMs: number,
    private readonly clock: Clock = systemClock,
  ) {}

  /** Whether `service` is one of the mesh's services. */
  static isService(service: string): service is MeshService {
    return (MESH_SERVICES as readonly string[]).includes(service);
  }

  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Adds or replaces an instance; returns the token its later heartbeats and withdrawal use. */
  announce(instance: MeshInstance): symbol {
    const token = Symbol(instance.id);
    const now = this.clock.now();
    this.byId.set(instance.id, { instance, announcedAtMs: now, lastSeenMs: now, token });
    this.changed();
    return token;
  }

  /** A heartbeat: the instance is alive, and serving or not. */
  heartbeat(id: string, token: symbol, serving: boolean): void {
    const entry = this.byId.get(id);
    if (entry?.token !== token) return;
    entry.lastSeenMs = this.clock.now();
    if (entry.instance.healthy !== serving) {
      entry.instance = { ...entry.instance, healthy: serving };
      this.changed();
    }
  }

  /** The announcement ended: the instance is gone, unless a newer announcement replaced it. */
  withdraw(id: string, token: symbol): void {
    if (this.byId.get(id)?.token !== token) return;
    this.byId.delete(id);
    this.changed();
  }

  /** Withdraws the instances silent for longer than the timeout; true when any was. */
  sweep(): boolean {
    const cutoff = this.clock.now() - this.timeoutMs;
    let removed = false;
    for (const [id, entry] of this.byId) {
      if (entry.lastSeenMs < cutoff) {
        this.byId.delete(id);
        removed = true;
      }
    }
    if (removed) this.changed();
    return removed;
  }

  /**
   * The instances announced here and, with several replicas of the registry, those announced to the
   * others: of two announcements of one id, the newer (an instance that restarted and announced
   * itself to another replica before its old stream here ended).
   */
  list(): MeshInstance[] {
    const now = this.clock.now();
    const newest = new Map<string, { instance: MeshInstance; announcedAtMs: number }>();
    for (const entry of [...this.byId.values(), ...this.remote.filter((r) => r.expiresAtMs > now)]) {
      const known = newest.get(entry.instance.id);
      if (known === undefined || entry.announcedAtMs > known.announcedAtMs) newest.set(entry.instance.id, entry);
    }
    return [...newest.values()].map((e) => e.instance).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** Only the instances announced to this replica, with when each announcement began and was last heard from. */
  local(): { instance: MeshInstance; announcedAtMs: number; lastSeenMs: number }[] {
    return [...this.byId.values()].map(({ instance, announcedAtMs, lastSeenMs }) => ({
      instance,
      announcedAtMs,
      lastSeenMs,
    }));
  }

  /**
   * Takes what the other replicas of the registry hold now (RedisInstanceMirror); listeners hear of
   * it when the instances listed change.
   */
  setRemote(remote: readonly RemoteInstance[]): void {
    const before = JSON.stringify(this.list());
    this.remote = remote;
    if (JSON.stringify(this.list()) !== before) this.changed();
  }

  private changed(): void {
    for (const listener of this.listeners) listener();
  }
}
