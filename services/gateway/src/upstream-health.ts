import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { requestContext } from '@infermesh/telemetry';

export interface UpstreamHealthOptions {
  /** Upstream name -> address. */
  upstreams: Record<string, string>;
  /** How long one grpc.health.v1 Check may take. */
  timeoutMs: number;
  /** How long an answer is reused, so that probes do not multiply into upstream calls. */
  cacheMs: number;
  now?: () => number;
}

/**
 * Whether every upstream the gateway needs answers grpc.health.v1 Check with SERVING. Concurrent
 * callers share one probe, and the answer is reused for `cacheMs`.
 */
export class UpstreamHealth {
  private readonly clients: [string, ServiceClient<typeof Health>][];
  private readonly now: () => number;
  private cached: { at: number; serving: boolean } | undefined;
  private inflight: Promise<boolean> | undefined;

  constructor(private readonly options: UpstreamHealthOptions) {
    this.clients = Object.entries(options.upstreams).map(([name, address]) => [name, createClient(Health, address)]);
    this.now = options.now ?? Date.now;
  }

  async allServing(): Promise<boolean> {
    const cached = this.cached;
    if (cached !== undefined && this.now() - cached.at < this.options.cacheMs) return cached.serving;
    // Its own context: a shared probe must not be cut short by the deadline of whichever request started it.
    this.inflight ??= requestContext.run({ requestId: 'readiness-probe' }, () => this.probe()).finally(() => {
      this.inflight = undefined;
    });
    return this.inflight;
  }

  private async probe(): Promise<boolean> {
    const results = await Promise.all(
      this.clients.map(async ([, client]) => {
        try {
          const { status } = await client.check({ service: '' }, { timeoutMs: this.options.timeoutMs });
          return status === ServingStatus.SERVING;
        } catch {
          return false;
        }
      }),
    );
    const serving = results.every(Boolean);
    this.cached = { at: this.now(), serving };
    return serving;
  }

  close(): void {
    for (const [, client] of this.clients) client.close();
  }
}
