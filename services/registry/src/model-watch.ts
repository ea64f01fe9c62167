import { create } from '@bufbuild/protobuf';
import { Inject, Injectable, type BeforeApplicationShutdown } from '@nestjs/common';
import { Errors } from '@infermesh/grpc';
import {
  type Model,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { Clock, systemClock } from '@infermesh/clock';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { ModelStore } from './model-store';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';

/** Messages a slow watcher may have waiting before they are replaced by one snapshot. */
const MAX_QUEUED_MESSAGES = 256;

/** What the registry last read from the store: every model by name, and the revision it is at. */
interface View {
  /** The revision of the last message: the store counter, or a newer model revision read with it. */
  revision: bigint;
  /** The store-wide counter when the models were last listed. */
  storeRevision: number;
  models: Map<string, Model>;
}

/** One open WatchModels stream: the messages waiting for it, and a way to wake it. */
class Watcher {
  private queue: WatchModelsResponse[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  constructor(private readonly snapshotOf: () => WatchModelsResponse) {}

  push(message: WatchModelsResponse): void {
    if (this.ended) return;
    // A watcher that does not keep up gets where things are instead of every step on the way.
    if (this.queue.length >= MAX_QUEUED_MESSAGES) this.queue = [this.snapshotOf()];
    else this.queue.push(message);
    this.wakeUp();
  }

  end(): void {
    this.ended = true;
    this.wakeUp();
  }

  /** The next message, or undefined once the stream ends. */
  async next(): Promise<WatchModelsResponse | undefined> {
    while (this.queue.length === 0 && !this.ended) await new Promise<void>((resolve) => (this.wake = resolve));
    if (this.ended) return undefined;
    return this.queue.shift();
  }

  private wakeUp(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }
}

/**
 * Streams the registry's models to followers (router, batcher, workers): a snapshot, then every change.
 * One loop serves every watcher of the process: it diffs the store's models by revision whenever the
 * store-wide revision moved, checked every `watchPollMs` (changes made by other replicas sharing
 * Redis) and at once after this replica's own writes (notify). The loop runs while someone watches.
 */
@Injectable()
export class ModelWatch implements BeforeApplicationShutdown {
  private readonly watchers = new Set<Watcher>();
  private view: View | undefined;
  private viewLoading: Promise<void> | undefined;
  /** Bumped whenever the loop stops, so that a read started before does not install a stale view. */
  private generation = 0;
  private cancelTimer: (() => void) | undefined;
  private polling: Promise<void> | undefined;
  private pollAgain = false;
  private closed = false;
  /** Whether the last poll failed: a failure is logged once, not every poll, and so is the recovery. */
  private storeDown = false;

  constructor(
    private readonly store: ModelStore,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
    private readonly clock: Clock = systemClock,
  ) {
    metrics.gauge('watchers', 'Open WatchModels streams.', [], (gauge) => gauge.set(this.watchers.size));
  }

  /**
   * The stream of one follower that has seen `fromRevision` (0: none): first every model (a snapshot)
   * with the current revision, or only that revision when the follower is current; then one message per change
   * with the changed models and the names of deleted ones. Ends when `signal` aborts or the registry
   * shuts down.
   */
  async *watch(fromRevision: bigint, signal: AbortSignal): AsyncGenerator<WatchModelsResponse> {
    if (this.closed) throw Errors.upstreamUnavailable('the registry is shutting down; watch another replica or retry');
    while (this.view === undefined) await this.loadView();
    const view = this.view;
    const watcher = new Watcher(() => this.snapshot());
    this.watchers.add(watcher);
    // Leaves at once when the call ends, even while the transport still waits to write to it.
    const leave = () => {
      watcher.end();
      if (this.watchers.delete(watcher) && this.watchers.size === 0) this.stopLoop();
    };
    signal.addEventListener('abort', leave, { once: true });
    try {
      if (signal.aborted) return;
      yield fromRevision !== 0n && fromRevision === view.revision
        ? create(WatchModelsResponseSchema, { revision: view.revision })
        : this.snapshot();
      for (;;) {
        const message = await watcher.next();
        if (message === undefined) return;
        yield message;
      }
    } finally {
      signal.removeEventListener('abort', leave);
      leave();
    }
  }

  /** Looks for changes now: called after this replica stored one. Resolves once they are sent. */
  notify(): Promise<void> {
    return this.view === undefined ? Promise.resolve() : this.poll();
  }

  /** Ends every stream and stops the loop; new watches are refused. */
  async close(): Promise<void> {
    this.closed = true;
    for (const watcher of this.watchers) watcher.end();
    this.stopLoop();
    await this.polling;
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.close();
  }

  private snapshot(): WatchModelsResponse {
    const view = this.view!;
    const models = [...view.models.keys()].sort().map((name) => view.models.get(name)!);
    return create(WatchModelsResponseSchema, { revision: view.revision, models, snapshot: true });
  }

  /** Reads every model to start the loop from; one read serves every watcher that waits for it. */
  private loadView(): Promise<void> {
    this.viewLoading ??= (async () => {
      const generation = this.generation;
      try {
        const storeRevision = await this.store.revision();
        const models = await this.store.list();
        if (generation !== this.generation || this.closed) return;
        this.view = {
          revision: maxRevision(BigInt(storeRevision), models),
          storeRevision,
          models: new Map(models.map((m) => [m.name, m])),
        };
        this.cancelTimer = this.clock.setRepeatingTimer(() => void this.poll(), this.config.watchPollMs);
      } catch (error) {
        throw Errors.upstreamUnavailable(
          `the registry's model store is unavailable: ${error instanceof Error ? error.message : String(error)}`,
        );
      } finally {
        this.viewLoading = undefined;
      }
    })();
    return this.viewLoading.then(() => {
      if (this.closed)
        throw Errors.upstreamUnavailable('the registry is shutting down; watch another replica or retry');
    });
  }

  private stopLoop(): void {
    this.generation += 1;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    this.view = undefined;
  }

  /** One poll at a time; a poll asked for while one runs runs once more after it. */
  private poll(): Promise<void> {
    if (this.polling !== undefined) {
      this.pollAgain = true;
      return this.polling;
    }
    this.polling = (async () => {
      try {
        do {
          this.pollAgain = false;
          await this.pollOnce();
        } while (this.pollAgain && this.view !== undefined);
        if (this.storeDown) this.logger.info('model watch: the store is available again');
        this.storeDown = false;
      } catch (error) {
        if (!this.storeDown) {
          this.logger.warn('model watch: the store is unavailable; watchers keep what they have until it is back', {
            err: error instanceof Error ? error.message : String(error),
          });
        }
        this.storeDown = true;
      } finally {
        this.polling = undefined;
      }
    })();
    return this.polling;
  }

  /** Sends what changed since the last look, when the store-wide revision moved. */
  private async pollOnce(): Promise<void> {
    const generation = this.generation;
    if (this.view === undefined) return;
    const storeRevision = await this.store.revision();
    if (generation !== this.generation || storeRevision === this.view.storeRevision) return;
    const models = await this.store.list();
    const view = this.view;
    if (generation !== this.generation || view === undefined) return;
    const listed = new Map(models.map((m) => [m.name, m]));
    const changed = models.filter((m) => view.models.get(m.name)?.revision !== m.revision);
    const deleted = [...view.models.keys()].filter((name) => !listed.has(name)).sort();
    view.storeRevision = storeRevision;
    view.models = listed;
    if (changed.length === 0 && deleted.length === 0) return;
    const revision = maxRevision(BigInt(storeRevision), changed);
    view.revision = revision > view.revision ? revision : view.revision;
    const message = create(WatchModelsResponseSchema, { revision: view.revision, models: changed, deleted });
    for (const watcher of this.watchers) watcher.push(message);
  }
}

/** The newest of a store revision and the revisions of models read with it. */
function maxRevision(storeRevision: bigint, models: readonly Model[]): bigint {
  return models.reduce((max, model) => (model.revision > max ? model.revision : max), storeRevision);
}
