import { clone } from '@bufbuild/protobuf';
import { Inject, Injectable, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import {
  type Model,
  type ModelVersion,
  ModelVersionSchema,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { modelIdOf, splitVersionName } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { message, ModelLifecycle } from './model-lifecycle';
import { ModelRegistry } from './model-registry';
import { isPlaced } from './model-placement';
import { ModelTable, WorkerModel } from './model-table';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** Registry states of versions the worker serves. */
const SERVED = new Set([VersionState.REGISTERED, VersionState.LOADING, VersionState.READY]);
/** Registry states in which a version already known stays (a loaded DRAINING one finishes its traffic). */
const KEPT = new Set([...SERVED, VersionState.DRAINING, VersionState.FAILED]);
/** Registry states of versions no worker has loaded yet: loading one once is how it is validated. */
const UNVALIDATED = new Set([VersionState.REGISTERED, VersionState.LOADING]);
/** How long a change the watch reports waits for the ones that follow it, so that a burst makes one sync. */
const CHANGE_DEBOUNCE_MS = 5;

/** A version of a model as the registry has it, with what it asks of this worker. */
interface Wanted {
  version: ModelVersion;
  /** The model is unloaded: none of its versions serves, and only a loaded DRAINING one stays until it drains. */
  unloaded: boolean;
  /** Model.pinned or WORKER_PINNED_MODELS. */
  pinned: boolean;
}

/**
 * Keeps the worker's view of the registry current. The models come from the registry watch while it
 * is connected, so that a change made in the registry applies here as soon as it arrives (a sync
 * runs a few milliseconds after each); otherwise from ListModels, every WORKER_SYNC_INTERVAL_MS (also
 * the watch's backstop) and when a request names a version this worker does not know. Each sync
 * learns the new versions, forgets (and unloads, once their requests in flight are done) those the
 * registry no longer serves, and decides what to load ahead of requests:
 * - pinned versions (Model.pinned or WORKER_PINNED_MODELS), evicting others if needed;
 * - versions no worker has loaded yet, so that the registry learns they work (READY) or not (FAILED);
 * - any other version while it fits in the memory budget without evicting anything.
 * Everything else loads on its first request. Models outside the worker's placement (WORKER_MODELS)
 * are skipped altogether: never loaded, never reported. A version of an unloaded model is never loaded; a
 * DRAINING version stays loaded, serving late requests, until the registry retires it. A registry
 * that cannot be reached changes nothing: loaded models keep serving and the next sync tries again.
 */
@Injectable()
export class ModelSync implements OnApplicationBootstrap, OnApplicationShutdown {
  private stopTimer: (() => void) | undefined;
  /** Calls off the sync a change has asked for; undefined when none waits. */
  private cancelDebounce: (() => void) | undefined;
  private running: Promise<void> | undefined;
  private again: Promise<void> | undefined;
  private stopped = false;
  private synced = false;
  private registryReachable: boolean | undefined;
  private readonly syncFailures: Counter;
  /** Whether each known version was last pinned by the registry or the configuration: a change of it re-pins or unpins. */
  private readonly pinnedBy = new Map<string, boolean>();
  /** This worker's copy of each record the watch holds: the lifecycle updates its own state on it. */
  private readonly copies = new WeakMap<ModelVersion, ModelVersion>();

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly registry: ModelRegistry,
    private readonly watch: RegistryWatch,
    private readonly lifecycle: ModelLifecycle,
    private readonly table: ModelTable,
    private readonly logger: JsonLogger,
    metrics: Metrics,
    private readonly clock: Clock,
  ) {
    this.syncFailures = metrics.counter(
      'registry_sync_failures_total',
      "Syncs that could not list the registry's models.",
    );
  }

  onApplicationBootstrap(): void {
    void this.syncNow();
    this.stopTimer = this.clock.setRepeatingTimer(() => void this.syncNow(), this.config.syncIntervalMs);
    this.watch.onChange(() => {
      if (this.stopped || this.cancelDebounce !== undefined) return;
      this.cancelDebounce = this.clock.setTimer(() => {
        this.cancelDebounce = undefined;
        void this.syncNow();
      }, CHANGE_DEBOUNCE_MS);
    });
  }

  /**
   * One sync; never rejects. A call while one runs is answered by one more sync after it, which sees
   * what changed meanwhile (concurrent calls share it).
   */
  syncNow(): Promise<void> {
    if (this.running !== undefined) {
      this.again ??= this.running.then(() => {
        this.again = undefined;
        return this.syncNow();
      });
      return this.again;
    }
    this.running = this.sync()
      .catch((error: unknown) => this.logger.error('model sync failed', { err: message(error) }))
      .finally(() => (this.running = undefined));
    return this.running;
  }

  /**
   * Resolves once a sync has read the registry and every pinned version it names is READY: when
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
      await this.clock.sleep(50);
    }
  }

  /** Learns about the version behind a request that names one this worker does not know yet. */
  async lookup(name: string): Promise<WorkerModel | undefined> {
    await this.syncNow();
    return this.table.get(name);
  }

  async onApplicationShutdown(): Promise<void> {
    this.stopped = true;
    this.stopTimer?.();
    this.cancelDebounce?.();
    await this.lifecycle.shutdown();
    await this.running;
    await this.again;
    this.registry.close();
  }

  private async sync(): Promise<void> {
    if (this.stopped) return;
    const models = await this.currentModels();
    if (models === undefined || this.stopped) return;

    const wanted = new Map<string, Wanted>();
    for (const model of models) {
      // A model outside this worker's placement is never known here: never loaded, never reported.
      if (!isPlaced(this.config, modelIdOf(model.name))) continue;
      const pinned = model.pinned || this.config.pinnedModels.has(modelIdOf(model.name));
      for (const version of model.versions)
        wanted.set(version.name, { version: this.copyOf(version), unloaded: model.unloaded, pinned });
    }
    for (const entry of this.table.list()) {
      if (!keeps(entry, wanted.get(entry.name))) {
        this.pinnedBy.delete(entry.name);
        void this.lifecycle.retire(entry);
      }
    }
    // Loads queued by earlier syncs will take room too.
    let plannedBytes = this.table
      .list()
      .filter((e) => e.loading !== undefined)
      .reduce((sum, e) => sum + this.lifecycle.estimateBytes(e), 0);
    const toLoad: WorkerModel[] = [];
    // Pinned versions first: the others only fill the room they leave.
    for (const { version, unloaded, pinned } of [...wanted.values()].sort(
      (a, b) => Number(b.pinned) - Number(a.pinned),
    )) {
      if (unloaded) continue;
      let entry = this.table.get(version.name);
      if (entry === undefined) {
        if (!SERVED.has(version.state)) continue;
        const ids = splitVersionName(version.name);
        if (ids === undefined) {
          this.logger.warn('ignoring a version with a malformed name', { name: version.name });
          continue;
        }
        entry = new WorkerModel(version.name, ids.modelId, ids.versionId, version, pinned, this.clock);
        this.table.add(entry);
      } else {
        entry.record = version;
        // LoadModel / UnloadModel may pin or unpin a version by hand; that holds until the registry's or the configuration's say changes.
        if (this.pinnedBy.get(entry.name) !== pinned) entry.pinned = pinned;
      }
      this.pinnedBy.set(entry.name, pinned);
      if (this.shouldLoad(entry, plannedBytes)) {
        toLoad.push(entry);
        plannedBytes += this.lifecycle.estimateBytes(entry);
      } else if (UNVALIDATED.has(version.state)) await this.reportAgain(entry);
    }
    this.synced = true;
    // Loads run one at a time in the lifecycle, apart from the sync, so that a change arriving
    // meanwhile is not held up by them; errors are logged and counted there.
    for (const entry of toLoad) void this.lifecycle.ensureLoaded(entry).catch(() => undefined);
  }

  /**
   * The models as the registry has them: the watch's while it is connected, else asked with
   * ListModels; undefined when the registry cannot be reached (what is loaded keeps serving).
   */
  private async currentModels(): Promise<Model[] | undefined> {
    if (this.watch.isConnected && this.watch.isSynced) return this.watch.models();
    try {
      const models = await this.registry.listModels();
      if (this.registryReachable === false)
        this.logger.info('registry reachable again', { registry: this.config.registryAddress });
      this.registryReachable = true;
      return models;
    } catch (error) {
      this.syncFailures.inc();
      if (this.registryReachable !== false) {
        this.logger.warn('registry unreachable; serving the models already loaded and retrying', {
          registry: this.config.registryAddress,
          err: message(error),
        });
      }
      this.registryReachable = false;
      return undefined;
    }
  }

  /** This worker's copy of a record: the same one for as long as the registry's record is the same. */
  private copyOf(version: ModelVersion): ModelVersion {
    let copy = this.copies.get(version);
    if (copy === undefined) {
      copy = clone(ModelVersionSchema, version);
      this.copies.set(version, copy);
    }
    return copy;
  }

  private shouldLoad(entry: WorkerModel, plannedBytes: number): boolean {
    if (entry.state !== ModelState.UNLOADED || entry.loading !== undefined) return false;
    // A version that leaves service (DRAINING) is not loaded again.
    if (!SERVED.has(entry.record.state)) return false;
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
      await this.registry.reportState(entry.name, state, entry.reason, entry.warmUpError);
      entry.record.state = state;
    } catch (error) {
      this.logger.warn('could not report a version state; will report again', {
        name: entry.name,
        err: message(error),
      });
    }
  }
}

/**
 * Whether a version this worker knows stays: the registry still has it in a state that is served or
 * failed, its model is not unloaded, or it is DRAINING and loaded (it serves late requests until the
 * registry retires it, or returns it to REGISTERED when its model was unloaded).
 */
function keeps(entry: WorkerModel, wanted: Wanted | undefined): boolean {
  if (wanted === undefined) return false;
  const { state } = wanted.version;
  if (state === VersionState.DRAINING) return entry.session !== undefined;
  return !wanted.unloaded && KEPT.has(state);
}
