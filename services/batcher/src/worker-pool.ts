import { Inject, Injectable, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import {
  type CallOptions,
  type ClientOptions,
  createClient,
  Errors,
  type ServiceClient,
  toRpcError,
} from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { splitVersionName } from '@infermesh/rollout';
import {
  type CallOutcome,
  type EdgeRetry,
  edgeRetryOf,
  type OutlierDetection,
  OutlierDetector,
  outlierDetectionOf,
  XDS_TYPES,
} from '@infermesh/mesh';
import { behindSidecar, MeshXds, type RuntimeSettings } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter, Gauge } from 'prom-client';
import { BATCHER_CONFIG, type BatcherConfig } from './batcher.config';

/** A worker as the batcher sees it: its connection, what it has ready, and its outstanding work. */
export class WorkerHandle {
  readonly client: ServiceClient<typeof WorkerService>;
  /** Resource names of the versions this worker reported READY at its last poll. */
  ready = new Set<string>();
  /** Versions it knows but has not in memory (never loaded, or evicted): it loads one when asked. */
  loadable = new Set<string>();
  reachable = false;
  /**
   * The models it serves, as its ListModels says (WORKER_MODELS); empty: every model. It is sent a
   * version of no other model, whatever it lists.
   */
  placement: ReadonlySet<string> = new Set();
  /** Batches sent to it and not answered yet. */
  outstanding = 0;

  /**
   * `clientOptions`: how the batcher dials its workers (workerClientOptions). Its batches go carried
   * on a stream (WorkerService.Infers), not a call each: on grpc-js a message on an open stream costs
   * a fraction of a call's CPU. The stream loses what only a call has, per-call balancing and retries
   * by the mesh, and this edge has neither: the batcher chooses the worker and retries itself.
   */
  constructor(
    readonly address: string,
    clientOptions: ClientOptions,
  ) {
    this.client = createClient(WorkerService, address, { ...clientOptions, carried: { infer: 'infers' } });
  }

  /** Whether its placement includes the model. */
  serves(model: string): boolean {
    return this.placement.size === 0 || this.placement.has(model);
  }

  async infer(request: InferenceRequest, options?: CallOptions): Promise<InferenceResponse> {
    this.outstanding += 1;
    try {
      const { response } = await this.client.infer({ request }, options);
      if (response === undefined) throw Errors.internal(`worker ${this.address} answered without a response`);
      return response;
    } finally {
      this.outstanding -= 1;
    }
  }
}

/**
 * How the batcher dials its workers. It chooses them itself, so no sidecar proxies this edge: behind
 * its own sidecar (the process speaking plaintext) it dials the port each worker announced, that
 * worker's sidecar's inbound listener, which requires mutual TLS. It then presents the instance's
 * identity (none, plaintext, when the mesh has no mutual TLS) and accepts only a worker's. Without a
 * sidecar, the process's own transport security, as every client. Either way its messages may be as
 * large as those the batcher receives (BATCHER_MAX_MESSAGE_BYTES), which its batches are kept within.
 */
export function workerClientOptions(runtime: RuntimeSettings): ClientOptions {
  const limits = { maxMessageBytes: runtime.maxMessageBytes };
  if (!behindSidecar(runtime)) return limits;
  return { ...limits, peer: 'worker', transport: runtime.tls ?? null };
}

/**
 * The workers the batcher dispatches to. Each is polled for the versions it has READY and for its
 * placement (the models it serves); a worker that does not answer holds nothing until it answers
 * again. A version only ever goes to a reachable worker whose placement includes its model. A request
 * for a version no worker is known to hold triggers an immediate poll (shared by concurrent requests)
 * before it is refused.
 */
/**
 * The batcher → worker edge without a mesh: a failed batch goes once more to another worker, and no
 * worker is ejected (one that does not answer holds nothing until it answers a poll again).
 */
export const STATIC_WORKER_RETRY: EdgeRetry = {
  on: ['unavailable'],
  attempts: 2,
  backoff: { baseMs: 0, maxMs: 0 },
  perTryTimeoutMs: undefined,
};
const NO_EJECTION: OutlierDetection = {
  consecutiveFailures: 0,
  consecutiveGatewayFailures: 0,
  interval: 10_000,
  baseEjectionTime: 30_000,
  maxEjectionPercent: 0,
};

@Injectable()
export class WorkerPool implements OnApplicationBootstrap, OnApplicationShutdown {
  workers: WorkerHandle[];
  /** How a failed batch is retried: the policy's batcher → worker edge in the mesh. */
  retry: EdgeRetry = STATIC_WORKER_RETRY;
  /** Ejects workers that fail (the policy's outlier detection of the edge, in the mesh): they get no batch until it ends. */
  private readonly outliers: OutlierDetector<string>;
  /** Stops the sweeps that end ejections. */
  private stopSweeps: (() => void) | undefined;
  private readonly ejectionsCounter: Counter;
  /** In the mesh: where to ask which workers there are. */
  private readonly directory: ServiceClient<typeof InstanceService> | undefined;
  /** Stops the periodic polls. */
  private stopPolls: (() => void) | undefined;
  private polling: Promise<void> | undefined;
  private readonly listeners: (() => void)[] = [];
  private readonly reachableGauge: Gauge;
  private readonly workerClient: ClientOptions;

  constructor(
    @Inject(BATCHER_CONFIG) private readonly config: BatcherConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
    xds: MeshXds,
    private readonly clock: Clock,
  ) {
    this.outliers = new OutlierDetector<string>(NO_EJECTION, clock);
    this.workerClient = workerClientOptions(config.runtime);
    this.workers =
      config.workerAddresses === 'mesh'
        ? []
        : config.workerAddresses.map((a) => new WorkerHandle(a, this.workerClient));
    this.directory =
      config.workerAddresses === 'mesh' ? createClient(InstanceService, config.runtime.mesh!.controlPlane) : undefined;
    this.outliers.setEndpoints(this.workers.map((w) => w.address));
    this.reachableGauge = metrics.gauge('workers_reachable', 'Workers that answered the last poll.');
    metrics.gauge(
      'workers_ejected',
      'Workers ejected now by the outlier detection of the batcher → worker edge.',
      [],
      (gauge) => gauge.set(this.outliers.activeEjections),
    );
    this.ejectionsCounter = metrics.counter(
      'worker_ejections_total',
      'Ejections of workers by the outlier detection of the batcher → worker edge.',
    );
    // In the mesh, the edge's retry and ejection settings are the policy's, pushed as it changes.
    xds.client?.watch(XDS_TYPES.listener, ['worker'], {
      parse: (resources) => (resources.has('worker') ? edgeRetryOf(resources.get('worker')) : STATIC_WORKER_RETRY),
      apply: (retry) => this.configureEdge({ retry }),
    });
    xds.client?.watch(XDS_TYPES.cluster, ['worker'], {
      parse: (resources) => (resources.has('worker') ? outlierDetectionOf(resources.get('worker')) : NO_EJECTION),
      apply: (outlierDetection) => this.configureEdge({ outlierDetection }),
    });
  }

  /** Takes new settings of the batcher → worker edge (the policy's, as the control plane pushes them); ejections in force stay. */
  configureEdge(settings: { retry?: EdgeRetry; outlierDetection?: OutlierDetection }): void {
    if (settings.retry !== undefined) this.retry = settings.retry;
    if (settings.outlierDetection !== undefined) {
      this.outliers.configure(settings.outlierDetection);
      this.stopSweeps?.();
      this.stopSweeps = this.clock.setRepeatingTimer(
        () => this.ejected(this.outliers.sweep()),
        settings.outlierDetection.interval,
      );
    }
  }

  /** Records how a worker answered a batch; ejects it when the edge's outlier detection says so. */
  recordOutcome(worker: WorkerHandle, outcome: CallOutcome): void {
    if (this.outliers.record(worker.address, outcome)) this.ejected([worker.address]);
  }

  private ejected(addresses: readonly string[]): void {
    for (const address of addresses) {
      this.ejectionsCounter.inc();
      this.logger.warn(`worker ${address} ejected: it failed too often`, {
        ejected_now: this.outliers.activeEjections,
      });
    }
  }

  async onApplicationBootstrap(): Promise<void> {
    await this.poll();
    this.stopPolls = this.clock.setRepeatingTimer(() => void this.poll(), this.config.workerPollMs);
  }

  onApplicationShutdown(): void {
    this.stopPolls?.();
    this.stopSweeps?.();
    for (const worker of this.workers) worker.client.close();
    this.directory?.close();
  }

  /**
   * Workers that have the version ready; when none has, those that can load it on demand (a worker
   * evicts idle models under its memory budget and loads them again when asked).
   */
  async candidates(versionName: string): Promise<WorkerHandle[]> {
    const found = this.holding(versionName);
    if (found.length > 0) return found;
    await this.poll();
    return this.available(versionName);
  }

  /**
   * The workers a batch of the version can go to now, without asking them: those that have it ready,
   * else those that can load it.
   */
  available(versionName: string): WorkerHandle[] {
    const ready = this.holding(versionName);
    return ready.length > 0
      ? ready
      : this.notEjected(this.placed(versionName).filter((w) => w.loadable.has(versionName)));
  }

  /** Asks every worker again what it holds (one poll shared by concurrent callers). */
  refresh(): Promise<void> {
    return this.poll();
  }

  /** Calls the listener after every poll: what the workers hold may have changed. */
  onPolled(listener: () => void): void {
    this.listeners.push(listener);
  }

  /** Forgets what a worker holds after it failed to answer; the next poll tells again. */
  markUnreachable(worker: WorkerHandle): void {
    worker.reachable = false;
    worker.ready.clear();
    worker.loadable.clear();
  }

  /**
   * Forgets the versions of a model on a worker that refused it as outside its placement (it was
   * started again with another one): it is not sent the model again until a poll lists it.
   */
  markNotPlaced(worker: WorkerHandle, model: string): void {
    const prefix = `models/${model}/versions/`;
    for (const set of [worker.ready, worker.loadable]) {
      for (const name of set) if (name.startsWith(prefix)) set.delete(name);
    }
  }

  private holding(versionName: string): WorkerHandle[] {
    return this.notEjected(this.placed(versionName).filter((w) => w.ready.has(versionName)));
  }

  /** Reachable workers whose placement includes the version's model. */
  private placed(versionName: string): WorkerHandle[] {
    const model = splitVersionName(versionName)?.modelId;
    return this.workers.filter((w) => w.reachable && model !== undefined && w.serves(model));
  }

  /**
   * The workers less those the edge's outlier detection ejected — unless that leaves none: then all
   * of them (Envoy's panic mode), since an ejected worker may answer where no worker surely cannot.
   */
  private notEjected(workers: WorkerHandle[]): WorkerHandle[] {
    const healthy = workers.filter((w) => !this.outliers.isEjected(w.address));
    return healthy.length > 0 ? healthy : workers;
  }

  /**
   * In the mesh, the workers are the serving ones the control plane lists: new ones join, withdrawn
   * ones leave (their calls in flight finish). While the control plane cannot be asked, the last
   * list stays.
   */
  private async discover(): Promise<void> {
    if (this.directory === undefined) return;
    let addresses: string[];
    try {
      const { instances } = await this.directory.listInstances({}, { timeoutMs: this.config.workerTimeoutMs });
      addresses = instances
        .filter((i) => i.serving && i.instance?.service === 'worker')
        .map((i) => `${i.instance!.address}:${i.instance!.port}`);
    } catch (error) {
      this.logger.warn('the mesh control plane did not list the workers; keeping the last list', {
        err: toRpcError(error).message,
      });
      return;
    }
    const known = new Map(this.workers.map((w) => [w.address, w]));
    const next = addresses.map((a) => known.get(a) ?? new WorkerHandle(a, this.workerClient));
    for (const worker of this.workers) {
      if (!addresses.includes(worker.address)) {
        this.logger.info(`worker ${worker.address} left the mesh`);
        worker.client.close();
      }
    }
    this.workers = next;
    this.outliers.setEndpoints(addresses);
  }

  private poll(): Promise<void> {
    this.polling ??= this.discover()
      .then(() => Promise.all(this.workers.map((w) => this.pollOne(w))))
      .then(() => {
        this.polling = undefined;
        this.reachableGauge.set(this.workers.filter((w) => w.reachable).length);
        for (const listener of this.listeners) listener();
      });
    return this.polling;
  }

  private async pollOne(worker: WorkerHandle): Promise<void> {
    try {
      const { models, placedModels } = await worker.client.listModels({}, { timeoutMs: this.config.workerTimeoutMs });
      if (!worker.reachable)
        this.logger.info(`worker ${worker.address} is reachable`, {
          placement: placedModels.length === 0 ? '(every model)' : placedModels.join(','),
        });
      worker.reachable = true;
      worker.placement = new Set(placedModels);
      worker.ready = new Set(models.filter((m) => m.state === ModelState.READY).map((m) => m.name));
      worker.loadable = new Set(
        models.filter((m) => m.state === ModelState.UNLOADED || m.state === ModelState.LOADING).map((m) => m.name),
      );
    } catch (error) {
      if (worker.reachable)
        this.logger.warn(`worker ${worker.address} is unreachable`, { err: toRpcError(error).message });
      this.markUnreachable(worker);
    }
  }
}
