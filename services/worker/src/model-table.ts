import { Injectable } from '@nestjs/common';
import { type Clock, systemClock } from '@infermesh/clock';
import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { Metrics } from '@infermesh/telemetry';
import type { Gauge } from 'prom-client';
import { ModelProcessing } from './model-processing';
import type { ModelSession } from './model-runtime';

/**
 * One registered model version on this worker and its lifecycle: UNLOADED (known, not in memory),
 * LOADING, READY with a session and the memory it is charged, or FAILED with a reason. Requests hold
 * it while they run, so its session is released only once they are done, and an entry in use is
 * never evicted.
 */
export class WorkerModel {
  state: ModelState = ModelState.UNLOADED;
  reason = '';
  /** While READY: why it serves without warm-up (its synthetic warm-up failed); empty once warmed up. */
  warmUpError = '';
  session: ModelSession | undefined;
  /** What the loaded version is charged against the memory budget; 0 when it is not loaded. */
  memoryBytes = 0;
  /** Last time a request used it (ms since the epoch): eviction goes least recently used first. */
  lastUsedMs = 0;
  /** The load in progress, shared by every request that waits for it. */
  loading: Promise<void> | undefined;
  /** The registry no longer serves it here: it is never loaded again, and a load under way is dropped. */
  retired = false;
  private inflight = 0;
  private idleWaiters: (() => void)[] = [];
  private processingOf: { record: ModelVersion; processing: ModelProcessing } | undefined;

  constructor(
    readonly name: string,
    readonly model: string,
    readonly version: string,
    /** The registry's record: artifact, signature, processing. Refreshed by every sync. */
    public record: ModelVersion,
    public pinned: boolean,
    /** Time: when it was last used (systemClock unless given). */
    private readonly clock: Clock = systemClock,
  ) {}

  get executionProvider(): string {
    return this.session?.executionProvider ?? '';
  }

  /** READY with no request holding it: may be evicted. */
  get idle(): boolean {
    return this.state === ModelState.READY && this.inflight === 0;
  }

  /** The pre- and post-processing the registry declares for the version, built once per record. */
  get processing(): ModelProcessing {
    if (this.processingOf?.record !== this.record)
      this.processingOf = { record: this.record, processing: new ModelProcessing(this.record) };
    return this.processingOf.processing;
  }

  /** From the registry's signature; 0 when the model does not limit its batch. */
  get maxBatchSize(): number {
    return this.record.signature?.maxBatchSize ?? 0;
  }

  ready(session: ModelSession, memoryBytes: number, warmUpError = ''): void {
    this.session = session;
    this.memoryBytes = memoryBytes;
    this.state = ModelState.READY;
    this.reason = '';
    this.warmUpError = warmUpError;
  }

  fail(reason: string): void {
    this.state = ModelState.FAILED;
    this.reason = reason;
  }

  /** Runs `work` with the session held; unloading waits for it. */
  async use<T>(work: (session: ModelSession) => Promise<T>): Promise<T> {
    const session = this.session;
    if (session === undefined) throw new Error(`${this.name} has no session`);
    this.inflight += 1;
    this.lastUsedMs = this.clock.now();
    try {
      return await work(session);
    } finally {
      this.inflight -= 1;
      this.lastUsedMs = this.clock.now();
      if (this.inflight === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
    }
  }

  /**
   * Takes the session away at once (the entry becomes UNLOADED, or keeps `state` if given, and is
   * charged nothing), then waits for the requests holding it and frees it.
   */
  async unload(reason: string, state: ModelState = ModelState.UNLOADED): Promise<void> {
    const session = this.session;
    this.session = undefined;
    this.memoryBytes = 0;
    this.warmUpError = '';
    this.state = state;
    this.reason = reason;
    if (this.inflight > 0) await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    await session?.release();
  }
}

/** The model versions this worker knows, by resource name, and the memory the loaded ones are charged. */
@Injectable()
export class ModelTable {
  private readonly models = new Map<string, WorkerModel>();
  private readonly loadedGauge: Gauge<'device'>;
  private readonly memoryGauge: Gauge<'device'>;

  constructor(metrics: Metrics) {
    this.loadedGauge = metrics.gauge(
      'models_loaded',
      'Model versions loaded and READY on this worker, by execution provider.',
      ['device'],
    );
    this.memoryGauge = metrics.gauge(
      'models_loaded_bytes',
      'Memory the loaded model versions are charged against the budget, by execution provider.',
      ['device'],
    );
  }

  get(name: string): WorkerModel | undefined {
    return this.models.get(name);
  }

  /** Any version of a model, to tell "unknown model" from "unknown version". */
  hasModel(model: string): boolean {
    for (const entry of this.models.values()) if (entry.model === model) return true;
    return false;
  }

  list(): WorkerModel[] {
    return [...this.models.values()];
  }

  /** What every loaded version is charged, in all. */
  get usedBytes(): number {
    let used = 0;
    for (const entry of this.models.values()) used += entry.memoryBytes;
    return used;
  }

  add(entry: WorkerModel): void {
    this.models.set(entry.name, entry);
    this.changed();
  }

  /** Forgets a version: new requests no longer find it. */
  remove(name: string): WorkerModel | undefined {
    const entry = this.models.get(name);
    this.models.delete(name);
    this.changed();
    return entry;
  }

  /** Updates the gauges after a state change. */
  changed(): void {
    const loaded = new Map<string, { count: number; bytes: number }>();
    for (const entry of this.models.values()) {
      if (entry.session === undefined) continue;
      const device = entry.executionProvider;
      const sum = loaded.get(device) ?? { count: 0, bytes: 0 };
      sum.count += entry.state === ModelState.READY ? 1 : 0;
      sum.bytes += entry.memoryBytes;
      loaded.set(device, sum);
    }
    this.loadedGauge.reset();
    this.memoryGauge.reset();
    for (const device of ['cpu', ...loaded.keys()]) {
      const sum = loaded.get(device) ?? { count: 0, bytes: 0 };
      this.loadedGauge.set({ device }, sum.count);
      this.memoryGauge.set({ device }, sum.bytes);
    }
  }
}
