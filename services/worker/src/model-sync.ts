import { Inject, Injectable, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { type ModelVersion, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { message, ModelLifecycle } from './model-lifecycle';
import { ModelRegistry } from './model-registry';
import { ModelTable, parseVersionName, WorkerModel } from './model-table';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** Registry states of versions the worker serves. */
const SERVED = new Set([VersionState.REGISTERED, VersionState.LOADING, VersionState.READY]);
/** Registry states in which a version already known stays (draining finishes its traffic). */
const KEPT = new Set([...SERVED, VersionState.DRAINING, VersionState.FAILED]);
/** Registry states of versions no worker has loaded yet: loading one once is how it is validated. */
const UNVALIDATED = new Set([VersionState.REGISTERED, VersionState.LOADING]);

/**
 * Keeps the worker's view of the registry current: every interval it lists the versions, learns the
 * new ones, forgets (and unloads) those the registry no longer serves, and decides what to load
 * ahead of requests:
 * - pinned versions (WORKER_PINNED_MODELS), evicting others if needed;
 * - versions no worker has loaded yet, so that the registry learns they work (READY) or not (FAILED);
 * - any other version while it fits in the memory budget without evicting anything.
 * Everything else loads on its first request. A registry that cannot be reached changes nothing:
 * loaded models keep serving and the next interval tries again.
 */
@Injectable()
export class ModelSync implements OnApplicationBootstrap, OnApplicationShutdown {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  private synced = false;
  private registryReachable: boolean | undefined;
  private readonly syncFailures: Counter;

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly registry: ModelRegistry,
    private readonly lifecycle: ModelLifecycle,
    private readonly table: ModelTable,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.syncFailures = metrics.counter('registry_sync_failures_total', "Syncs that could not list the registry's models.");
  }

  onApplicationBootstrap(): void {
    void this.syncNow();
    this.timer = setInterval(() => void this.syncNow(), this.config.syncIntervalMs);
    this.timer.unref();
  }

  /** One sync; a call while one runs waits for that one. Never rejects. */
  syncNow(): Promise<void> {
    this.running ??= this.sync()
      .catch((error: unknown) => this.logger.error('model sync failed', { err: message(error) }))
      .finally(() => (this.running = undefined));
    return this.running;
  }

  /**
   * Resolves once a sync has listed the registry and every pinned version it names is READY: when
   * the worker can say SERVING. Waits through registry outages and retries.
   */
  async pinnedReady(): Promise<void> {
    if (this.config.pinnedModels.size === 0) return;
    for (;;) {
      if (this.stopped) return;
      if (this.synced) {
        const pinned = this.table.list().filter((e) => e.pinned);
        if (pinned.every((e) => e.state === ModelState.READY)) return;
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Learns about the version behind a request that names one this worker does not know yet. */
  async lookup(name: string): Promise<WorkerModel | undefined> {
    await this.syncNow();
    return this.table.get(name);
  }

  async onApplicationShutdown(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.lifecycle.shutdown();
    await this.running;
    this.registry.close();
  }

  private async sync(): Promise<void> {
    if (this.stopped) return;
    let versions: ModelVersion[];
    try {
      versions = await this.registry.listVersions();
    } catch (error) {
      this.syncFailures.inc();
      if (this.registryReachable !== false) {
        this.logger.warn('registry unreachable; serving the models already loaded and retrying', {
          registry: this.config.registryAddress,
          err: message(error),
        });
      }
      this.registryReachable = false;
      return;
    }
    if (this.registryReachable === false) this.logger.info('registry reachable again', { registry: this.config.registryAddress });
    this.registryReachable = true;

    const byName = new Map(versions.map((v) => [v.name, v]));
    for (const entry of this.table.list()) {
      const version = byName.get(entry.name);
      if (version === undefined || !KEPT.has(version.state) || (version.state === VersionState.DRAINING && entry.session === undefined)) {
        void this.lifecycle.retire(entry);
      }
    }
    const toLoad: WorkerModel[] = [];
    let plannedBytes = 0;
    // Pinned versions first: the others only fill the room they leave.
    const pinned = (v: ModelVersion) => Number(this.config.pinnedModels.has(parseVersionName(v.name)?.model ?? ''));
    for (const version of [...versions].sort((a, b) => pinned(b) - pinned(a))) {
      let entry = this.table.get(version.name);
      if (entry === undefined) {
        if (!SERVED.has(version.state)) continue;
        const ids = parseVersionName(version.name);
        if (ids === undefined) {
          this.logger.warn('ignoring a version with a malformed name', { name: version.name });
          continue;
        }
        entry = new WorkerModel(version.name, ids.model, ids.version, version, this.config.pinnedModels.has(ids.model));
        this.table.add(entry);
      } else {
        entry.record = version;
      }
      if (this.shouldLoad(entry, plannedBytes)) {
        toLoad.push(entry);
        plannedBytes += this.lifecycle.estimateBytes(entry);
      } else if (UNVALIDATED.has(version.state)) await this.reportAgain(entry);
    }
    this.synced = true;
    for (const entry of toLoad) {
      if (this.stopped) return;
      // Loads run one at a time in the lifecycle; errors are logged and counted there.
      await this.lifecycle.ensureLoaded(entry).catch(() => undefined);
    }
  }

  private shouldLoad(entry: WorkerModel, plannedBytes: number): boolean {
    if (entry.state !== ModelState.UNLOADED || entry.loading !== undefined) return false;
    // A version that found no room, or was evicted, loads again only when a request asks for it.
    if (entry.reason !== '') return false;
    if (entry.pinned) return true;
    return UNVALIDATED.has(entry.record.state) || this.lifecycle.fitsWithoutEviction(entry, plannedBytes);
  }

  /** A READY or FAILED report that was lost (registry down or restarted): say it again. */
  private async reportAgain(entry: WorkerModel): Promise<void> {
    if (entry.state !== ModelState.READY && entry.state !== ModelState.FAILED) return;
    const state = entry.state === ModelState.READY ? VersionState.READY : VersionState.FAILED;
    try {
      await this.registry.reportState(entry.name, state, entry.reason);
      entry.record.state = state;
    } catch (error) {
      this.logger.warn('could not report a version state; will report again', { name: entry.name, err: message(error) });
    }
  }
}
