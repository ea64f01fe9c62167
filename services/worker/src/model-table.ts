import { Injectable } from '@nestjs/common';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { Metrics } from '@infermesh/telemetry';
import type { Gauge } from 'prom-client';
import type { ModelSession } from './model-runtime';

/** models/{model}/versions/{version} */
export function versionName(model: string, version: string): string {
  return `models/${model}/versions/${version}`;
}

/** The model and version ids of a resource name, or undefined when it is not one. */
export function parseVersionName(name: string): { model: string; version: string } | undefined {
  const match = /^models\/([^/]+)\/versions\/([^/]+)$/.exec(name);
  return match === null ? undefined : { model: match[1]!, version: match[2]! };
}

/**
 * One model version on this worker and its lifecycle: LOADING, then READY with a session or FAILED
 * with a reason. Requests hold it while they run, so it is released only once they are done.
 */
export class WorkerModel {
  state: ModelState = ModelState.LOADING;
  reason = '';
  session: ModelSession | undefined;
  /** From the registry's signature; 0 when the model does not limit its batch. */
  maxBatchSize = 0;
  private inflight = 0;
  private idle: (() => void) | undefined;

  constructor(
    readonly name: string,
    readonly model: string,
    readonly version: string,
  ) {}

  get executionProvider(): string {
    return this.session?.executionProvider ?? '';
  }

  ready(session: ModelSession, maxBatchSize: number): void {
    this.session = session;
    this.maxBatchSize = maxBatchSize;
    this.state = ModelState.READY;
    this.reason = '';
  }

  fail(reason: string): void {
    this.state = ModelState.FAILED;
    this.reason = reason;
  }

  /** Runs `work` with the session held; release() waits for it. */
  async use<T>(work: (session: ModelSession) => Promise<T>): Promise<T> {
    const session = this.session;
    if (session === undefined) throw new Error(`${this.name} has no session`);
    this.inflight += 1;
    try {
      return await work(session);
    } finally {
      this.inflight -= 1;
      if (this.inflight === 0) this.idle?.();
    }
  }

  /** Waits for the requests holding the session, then frees it. */
  async release(): Promise<void> {
    if (this.inflight > 0) await new Promise<void>((resolve) => (this.idle = resolve));
    const session = this.session;
    this.session = undefined;
    await session?.release();
  }
}

/** The model versions this worker holds, by resource name. */
@Injectable()
export class ModelTable {
  private readonly models = new Map<string, WorkerModel>();
  private readonly loadedGauge: Gauge;

  constructor(metrics: Metrics) {
    this.loadedGauge = metrics.gauge('models_loaded', 'Model versions loaded and READY on this worker.');
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

  /** Updates the loaded gauge after a state change. */
  changed(): void {
    this.loadedGauge.set(this.list().filter((m) => m.state === ModelState.READY).length);
  }
}
