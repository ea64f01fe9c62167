import { MESH_SERVICES, type MeshInstance, type MeshService } from '@infermesh/mesh';

/** An instance as announced, and when it was last heard from. */
interface Announced {
  instance: MeshInstance;
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

  constructor(
    private readonly timeoutMs: number,
    private readonly now: () => number = Date.now,
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
    this.byId.set(instance.id, { instance, lastSeenMs: this.now(), token });
    this.changed();
    return token;
  }

  /** A heartbeat: the instance is alive, and serving or not. */
  heartbeat(id: string, token: symbol, serving: boolean): void {
    const entry = this.byId.get(id);
    if (entry?.token !== token) return;
    entry.lastSeenMs = this.now();
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
    const cutoff = this.now() - this.timeoutMs;
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

  list(): MeshInstance[] {
    return [...this.byId.values()].map((e) => e.instance).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  private changed(): void {
    for (const listener of this.listeners) listener();
  }
}
