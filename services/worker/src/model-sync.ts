import { Inject, Injectable, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { type ModelVersion, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { ArtifactCache, ArtifactVerificationError } from './artifact-cache';
import { ModelRegistry } from './model-registry';
import { ModelRuntime, type ModelSession } from './model-runtime';
import { ModelTable, parseVersionName, WorkerModel } from './model-table';
import { warmUpInputs } from './warm-up-inputs';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** Registry states of versions the worker loads. */
const LOADABLE = new Set([VersionState.REGISTERED, VersionState.LOADING, VersionState.READY]);
/** Registry states in which a version already loaded stays loaded (draining finishes its traffic). */
const KEPT = new Set([...LOADABLE, VersionState.DRAINING, VersionState.FAILED]);
/** Registry states a report of ours may move on; READY and FAILED are left alone to avoid flapping. */
const REPORTABLE = new Set([VersionState.REGISTERED, VersionState.LOADING]);

const LOAD_BUCKETS_SECONDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/** A failure that retrying the same bytes will not fix: the version is FAILED on this worker. */
class LoadFailure extends Error {}

/**
 * Keeps the worker's models in step with the registry: every interval it lists the versions, loads
 * those it lacks (download, verify, create a session, warm up, report READY or FAILED) and unloads
 * those the registry no longer serves. A registry that cannot be reached changes nothing: loaded
 * models keep serving and the next interval tries again.
 */
@Injectable()
export class ModelSync implements OnApplicationBootstrap, OnApplicationShutdown {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  private registryReachable: boolean | undefined;
  private readonly abort = new AbortController();
  private readonly releases = new Set<Promise<void>>();
  private readonly loadSeconds: Histogram<'model' | 'outcome'>;
  private readonly verificationFailures: Counter<'model'>;
  private readonly syncFailures: Counter;

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly registry: ModelRegistry,
    private readonly artifacts: ArtifactCache,
    private readonly runtime: ModelRuntime,
    private readonly table: ModelTable,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.loadSeconds = metrics.histogram(
      'model_load_duration_seconds',
      'Time to download, verify, load and warm up a model version, by outcome (ready, failed).',
      ['model', 'outcome'],
      LOAD_BUCKETS_SECONDS,
    );
    this.verificationFailures = metrics.counter(
      'artifact_verification_failures_total',
      'Artifacts refused because their bytes did not match the SHA-256 the registry recorded.',
      ['model'],
    );
    this.syncFailures = metrics.counter('registry_sync_failures_total', 'Syncs that could not list the registry\'s models.');
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

  async onApplicationShutdown(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.abort.abort();
    await this.running;
    for (const entry of this.table.list()) this.unload(entry);
    await Promise.all(this.releases);
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
      if (version === undefined || !KEPT.has(version.state)) this.unload(entry);
    }
    for (const version of versions) {
      if (this.stopped) return;
      const entry = this.table.get(version.name);
      if (entry === undefined) {
        if (LOADABLE.has(version.state)) await this.load(version);
      } else if (REPORTABLE.has(version.state)) {
        // A report that was lost (registry down, registry restarted): say it again.
        if (entry.state === ModelState.READY) await this.report(entry.name, VersionState.READY, '');
        if (entry.state === ModelState.FAILED) await this.report(entry.name, VersionState.FAILED, entry.reason);
      }
    }
  }

  private async load(version: ModelVersion): Promise<void> {
    const ids = parseVersionName(version.name);
    if (ids === undefined) {
      this.logger.warn('ignoring a version with a malformed name', { name: version.name });
      return;
    }
    const entry = new WorkerModel(version.name, ids.model, ids.version);
    this.table.add(entry);
    const start = process.hrtime.bigint();
    const seconds = () => Number(process.hrtime.bigint() - start) / 1e9;
    this.logger.info('loading model version', { name: entry.name, sha256: version.artifact?.sha256 });
    if (version.state === VersionState.REGISTERED) await this.report(entry.name, VersionState.LOADING, '');

    let session: ModelSession | undefined;
    try {
      const bytes = await this.fetchArtifact(version, entry);
      if (bytes === undefined) return; // transient: tried again next sync
      try {
        session = await this.runtime.load(bytes, this.config.executionProviders);
      } catch (error) {
        throw new LoadFailure(`could not create a session: ${message(error)}`);
      }
      try {
        await session.run(warmUpInputs(session.inputs), []);
      } catch (error) {
        throw new LoadFailure(`warm-up run failed on ${session.executionProvider}: ${message(error)}`);
      }
    } catch (error) {
      await session?.release();
      const reason = error instanceof LoadFailure ? error.message : `load failed: ${message(error)}`;
      if (this.stopped || this.table.get(entry.name) !== entry) return;
      entry.fail(reason);
      this.table.changed();
      this.loadSeconds.observe({ model: entry.model, outcome: 'failed' }, seconds());
      this.logger.error('model version failed to load', { name: entry.name, reason });
      await this.report(entry.name, VersionState.FAILED, reason);
      return;
    }
    if (this.stopped || this.table.get(entry.name) !== entry) {
      await session.release();
      return;
    }
    entry.ready(session, version.signature?.maxBatchSize ?? 0);
    this.table.changed();
    this.loadSeconds.observe({ model: entry.model, outcome: 'ready' }, seconds());
    this.logger.info('model version ready', {
      name: entry.name,
      execution_provider: session.executionProvider,
      load_ms: Math.round(seconds() * 1000),
    });
    await this.report(entry.name, VersionState.READY, '');
  }

  /**
   * The version's verified artifact. A mismatch or an artifact the registry does not have is a
   * LoadFailure; any other error (the registry went away mid-download) forgets the entry and returns
   * undefined, so that the next sync tries again.
   */
  private async fetchArtifact(version: ModelVersion, entry: WorkerModel): Promise<Buffer | undefined> {
    const sha256 = version.artifact?.sha256 ?? '';
    if (sha256 === '') throw new LoadFailure('the registry records no artifact for this version');
    try {
      return await this.artifacts.fetch(sha256, () => this.registry.download(sha256, this.abort.signal));
    } catch (error) {
      if (error instanceof ArtifactVerificationError) {
        this.verificationFailures.inc({ model: entry.model });
        throw new LoadFailure(`artifact refused: ${error.message}`);
      }
      if (error instanceof RpcError && error.code === status.NOT_FOUND) {
        throw new LoadFailure(`artifact ${sha256} is not in the registry: ${error.message}`);
      }
      if (this.table.get(entry.name) === entry) this.table.remove(entry.name);
      if (!this.stopped) this.logger.warn('artifact download failed; retrying next sync', { name: entry.name, err: message(error) });
      return undefined;
    }
  }

  private unload(entry: WorkerModel): void {
    if (this.table.get(entry.name) !== entry) return;
    this.table.remove(entry.name);
    this.logger.info('unloading model version', { name: entry.name });
    const released = entry
      .release()
      .catch((error: unknown) => this.logger.warn('releasing a session failed', { name: entry.name, err: message(error) }))
      .finally(() => this.releases.delete(released));
    this.releases.add(released);
  }

  private async report(name: string, state: VersionState, reason: string): Promise<void> {
    if (this.stopped) return;
    try {
      await this.registry.reportState(name, state, reason);
    } catch (error) {
      this.logger.warn('could not report a version state; will report again', {
        name,
        state: VersionState[state],
        err: message(error),
      });
    }
  }
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
