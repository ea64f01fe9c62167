import { type BeforeApplicationShutdown, Inject, Injectable, type OnApplicationBootstrap } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { Clock } from '@infermesh/clock';
import { type RpcError, toRpcError } from '@infermesh/grpc';
import type { TrafficCounters } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  addCounters,
  emptyCounters,
  isServiceError,
  latencyIndex,
  ROLLOUT_LATENCY_BOUNDS_SECONDS,
} from '@infermesh/rollout';
import { meshInstanceId, ServiceIdentity } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { RegistryAdapter } from './upstreams.adapter';

/** Versions whose counts wait for a report, at most: beyond, the oldest are dropped (counted). */
export const MAX_PENDING_VERSIONS = 4_096;
/** Budget of a periodic report. */
export const REPORT_TIMEOUT_MS = 2_000;
/** Budget of the last report, sent on shutdown, a report still on its way included. */
export const FINAL_REPORT_TIMEOUT_MS = 1_000;
/** A registry that keeps refusing reports is logged at most this often. */
const WARN_EVERY_MS = 60_000;

/**
 * What each model version served, reported to the registry (ReportTraffic) every
 * ROUTER_TRAFFIC_REPORT_INTERVAL_MS, for its SLO-gated automatic rollouts: the requests it answered,
 * those that failed (any error but CANCELLED) and, among them, those with the service's error
 * (isServiceError), the latency of the successful ones
 * over ROLLOUT_LATENCY_BOUNDS_SECONDS, and, while it ran as a shadow, the output items compared and those
 * that agreed. Versions are keyed by their resource names, not by the metric labels (which fold rare
 * names together).
 *
 * Each report carries the counts since the last one the registry accepted: a refused one (registry
 * down, or too old to take reports) is added into the next. Nothing is sent while nothing was
 * counted. Counts wait for at most MAX_PENDING_VERSIONS versions; the oldest beyond are dropped. The
 * last counts go on shutdown, once the router's calls have drained, within FINAL_REPORT_TIMEOUT_MS.
 */
@Injectable()
export class TrafficReporter implements OnApplicationBootstrap, BeforeApplicationShutdown {
  /** Counts since the last accepted report, by version resource name, the oldest first. */
  private pending = new Map<string, TrafficCounters>();
  private stopTimer: (() => void) | undefined;
  private sending: Promise<void> | undefined;
  private lastWarnMs = -Infinity;
  /** Reports refused since the last warning. */
  private refusedSinceWarn = 0;
  private readonly reporter: string;
  private readonly reports: Counter<'outcome'>;
  private readonly dropped: Counter;

  constructor(
    private readonly registry: RegistryAdapter,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
    identity: ServiceIdentity,
    private readonly logger: JsonLogger,
    metrics: Metrics,
    private readonly clock: Clock,
  ) {
    // The instance id the router announces itself to the mesh with (or would: <service>-<host>-<pid>).
    this.reporter = meshInstanceId(identity.name, identity.settings.mesh);
    this.reports = metrics.counter(
      'traffic_reports_total',
      'Traffic reports sent to the registry, by outcome: ok, or refused (their counts go into the next).',
      ['outcome'],
    );
    this.dropped = metrics.counter(
      'traffic_report_dropped_versions_total',
      `Versions whose unreported traffic counts were dropped: more than ${MAX_PENDING_VERSIONS} versions waited for a report.`,
    );
    metrics.gauge(
      'traffic_report_pending_versions',
      'Versions with traffic counted and not yet reported to the registry.',
      [],
      (gauge) => gauge.set(this.pending.size),
    );
  }

  onApplicationBootstrap(): void {
    this.stopTimer = this.clock.setRepeatingTimer(() => void this.report(), this.config.trafficReportIntervalMs);
  }

  /** A request answered successfully by the version (`models/{m}/versions/{v}`) in `seconds`. */
  succeeded(versionName: string, seconds: number): void {
    const counters = this.countersOf(versionName);
    counters.requests += 1n;
    const i = latencyIndex(seconds, ROLLOUT_LATENCY_BOUNDS_SECONDS);
    counters.latencyCounts[i] = (counters.latencyCounts[i] ?? 0n) + 1n;
  }

  /** A request the version failed with `code`: a failure unless the client cancelled it, and an error when it is the service's. */
  failed(versionName: string, code: status): void {
    const counters = this.countersOf(versionName);
    counters.requests += 1n;
    if (isServiceError(code)) counters.errors += 1n;
    if (code !== status.CANCELLED) counters.failures += 1n;
  }

  /** Output items the shadow version computed and compared with the served ones, and those it agreed on. */
  shadowCompared(shadowVersionName: string, items: number, agreed: number): void {
    if (items <= 0) return;
    const counters = this.countersOf(shadowVersionName);
    counters.shadowItems += BigInt(items);
    counters.shadowAgreed += BigInt(agreed);
  }

  /**
   * Sends what was counted since the last accepted report, unless nothing was; resolves once the
   * registry answered (a refused report's counts wait for the next). One report at a time: while one
   * is on its way, this waits for it.
   */
  report(): Promise<void> {
    this.sending ??= this.send(this.clock.now() + REPORT_TIMEOUT_MS).finally(() => (this.sending = undefined));
    return this.sending;
  }

  /** The last report: after the router's calls drained, before its registry client closes. */
  async beforeApplicationShutdown(): Promise<void> {
    this.stopTimer?.();
    const deadlineMs = this.clock.now() + FINAL_REPORT_TIMEOUT_MS;
    if (this.sending !== undefined) {
      let cancel = (): void => undefined;
      await Promise.race([
        this.sending,
        new Promise((resolve) => (cancel = this.clock.setTimer(() => resolve(undefined), FINAL_REPORT_TIMEOUT_MS))),
      ]);
      cancel();
    }
    if (this.clock.now() < deadlineMs) await this.send(deadlineMs);
  }

  private async send(deadlineMs: number): Promise<void> {
    if (this.pending.size === 0) return;
    const sent = this.pending;
    this.pending = new Map();
    try {
      await this.registry.reportTraffic(
        {
          reporter: this.reporter,
          latencyBoundsSeconds: [...ROLLOUT_LATENCY_BOUNDS_SECONDS],
          versions: [...sent].map(([name, counters]) => ({ name, counters })),
        },
        deadlineMs,
      );
      this.reports.inc({ outcome: 'ok' });
    } catch (error) {
      this.reports.inc({ outcome: 'refused' });
      this.putBack(sent);
      this.warnRefused(toRpcError(error));
    }
  }

  /** Adds a refused report's counts back, ahead of those counted since (they are older). */
  private putBack(sent: Map<string, TrafficCounters>): void {
    for (const [name, counters] of this.pending) {
      const held = sent.get(name);
      if (held === undefined) sent.set(name, counters);
      else addCounters(held, counters);
    }
    this.pending = sent;
    this.trim();
  }

  private countersOf(versionName: string): TrafficCounters {
    let counters = this.pending.get(versionName);
    if (counters === undefined) {
      counters = emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS);
      this.pending.set(versionName, counters);
      this.trim();
    }
    return counters;
  }

  /** Drops the oldest versions beyond MAX_PENDING_VERSIONS. */
  private trim(): void {
    for (const name of this.pending.keys()) {
      if (this.pending.size <= MAX_PENDING_VERSIONS) return;
      this.pending.delete(name);
      this.dropped.inc();
    }
  }

  private warnRefused(error: RpcError): void {
    this.refusedSinceWarn += 1;
    const now = this.clock.monotonic();
    if (now - this.lastWarnMs < WARN_EVERY_MS) return;
    const why =
      error.code === status.UNIMPLEMENTED
        ? 'the registry does not take traffic reports (older than the router?)'
        : 'the registry did not take the traffic report';
    this.logger.warn(`${why}; its counts go into the next report`, {
      registry: this.config.upstreams.registry,
      code: error.code,
      err: error.message,
      refused_reports: this.refusedSinceWarn,
      pending_versions: this.pending.size,
    });
    this.lastWarnMs = now;
    this.refusedSinceWarn = 0;
  }
}
