import { type Clock, systemClock } from '@infermesh/clock';
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { requestContext } from '@infermesh/telemetry';

export interface UpstreamHealthOptions {
  /** Upstream name -> address. */
  upstreams: Record<string, string>;
  /** How long one grpc.health.v1 Check may take. */
  timeoutMs: number;
  /** How long an answer is reused, so that probes do not multiply into upstream calls. */
  cacheMs: number;
  /** Time (systemClock unless given). */
  clock?: Clock;
}

/** What the last probe of one upstream found. */
export interface UpstreamState {
  serving: boolean;
  /** When it was probed, ISO 8601. */
  checkedAt: string;
}

/**
 * Whether each upstream the gateway talks to answers grpc.health.v1 Check with SERVING. Concurrent
 * callers share one probe of them all, and the answer is reused for `cacheMs`.
 */
export class UpstreamHealth {
  private readonly clients: [string, ServiceClient<typeof Health>][];
  private readonly clock: Clock;
  private cached: { at: number; states: Record<string, UpstreamState> } | undefined;
  private inflight: Promise<Record<string, UpstreamState>> | undefined;

  constructor(private readonly options: UpstreamHealthOptions) {
    this.clients = Object.entries(options.upstreams).map(([name, address]) => [name, createClient(Health, address)]);
    this.clock = options.clock ?? systemClock;
  }

  /** Whether the named upstream answers SERVING (probed, or the answer of the last `cacheMs`). */
  async serving(name: string): Promise<boolean> {
    return (await this.states())[name]?.serving ?? false;
  }

  /** Whether every upstream answers SERVING. */
  async allServing(): Promise<boolean> {
    return Object.values(await this.states()).every((state) => state.serving);
  }

  /** Each upstream's state as last probed, without waiting; a probe starts when the answer is stale. Undefined before the first probe. */
  lastKnown(): Record<string, UpstreamState> | undefined {
    void this.states().catch(() => undefined);
    return this.cached?.states;
  }

  private async states(): Promise<Record<string, UpstreamState>> {
    const cached = this.cached;
    if (cached !== undefined && this.clock.now() - cached.at < this.options.cacheMs) return cached.states;
    // Its own context: a shared probe must not be cut short by the deadline of whichever request started it.
    this.inflight ??= requestContext
      .run({ requestId: 'readiness-probe' }, () => this.probe())
      .finally(() => {
        this.inflight = undefined;
      });
    return this.inflight;
  }

  private async probe(): Promise<Record<string, UpstreamState>> {
    const results = await Promise.all(
      this.clients.map(async ([name, client]): Promise<[string, boolean]> => {
        try {
          const { status } = await client.check({ service: '' }, { timeoutMs: this.options.timeoutMs });
          return [name, status === ServingStatus.SERVING];
        } catch {
          return [name, false];
        }
      }),
    );
    const at = this.clock.now();
    const checkedAt = new Date(at).toISOString();
    const states = Object.fromEntries(results.map(([name, serving]) => [name, { serving, checkedAt }]));
    this.cached = { at, states };
    return states;
  }

  close(): void {
    for (const [, client] of this.clients) client.close();
  }
}
