import type { MessageInitShape } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { type AnnounceRequestSchema, InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import type { JsonLogger } from '@infermesh/telemetry';
import { hostname } from 'node:os';
import { meshInstanceId } from './mesh-xds';
import type { MeshSettings } from './runtime-config';

type AnnounceRequest = MessageInitShape<typeof AnnounceRequestSchema>;

/**
 * Keeps a service announced to the mesh's control plane (InstanceService.Announce) while it runs:
 * who it is and where (its gRPC port, or its sidecar's inbound port behind one), then a heartbeat
 * with its serving state. A stream that breaks (the registry restarts) is opened again with backoff;
 * stop() ends it, so the control plane withdraws the instance before the service drains its calls.
 */
export class MeshAnnouncer {
  private client: ServiceClient<typeof InstanceService> | undefined;
  private stopped = false;
  private wake: (() => void) | undefined;
  private running: Promise<void> | undefined;
  readonly instanceId: string;

  constructor(
    private readonly service: string,
    private readonly settings: MeshSettings,
    private readonly grpc: { host: string; port: number },
    private readonly serving: () => boolean,
    private readonly logger: JsonLogger,
    /** Time: heartbeats and the backoff between attempts (systemClock unless given). */
    private readonly clock: Clock = systemClock,
  ) {
    this.instanceId = meshInstanceId(service, settings);
  }

  start(): void {
    this.client = createClient(InstanceService, this.settings.controlPlane);
    this.running = this.loop();
  }

  /** Sends the serving state now rather than at the next heartbeat (it just changed). */
  heartbeatNow(): void {
    this.wake?.();
  }

  /** Ends the announcement (the control plane withdraws the instance at once) and stops. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.wake?.();
    await this.running;
    this.client?.close();
  }

  private async loop(): Promise<void> {
    let backoffMs = 100;
    while (!this.stopped) {
      const started = this.clock.monotonic();
      try {
        // A quick call first, so that the stream opens on a connection that works: a call made while
        // the registry is still starting would wait for grpc-js to give up on it.
        await this.client!.listInstances({}, { timeoutMs: 1_000 });
      } catch {
        if (this.stopped) return;
        await this.sleep(Math.min(backoffMs, 1_000));
        backoffMs = Math.min(5_000, backoffMs * 2);
        continue;
      }
      try {
        await this.client!.announce(this.messages(), {});
      } catch (error) {
        if (!this.stopped)
          this.logger.warn('announcement to the mesh control plane broke; announcing again', {
            control_plane: this.settings.controlPlane,
            err: String(error),
          });
      }
      if (this.stopped) return;
      backoffMs = this.clock.monotonic() - started > 10_000 ? 100 : Math.min(5_000, backoffMs * 2);
      await this.sleep(Math.random() * backoffMs);
    }
  }

  private async *messages(): AsyncGenerator<AnnounceRequest> {
    const address =
      this.settings.address ?? (this.grpc.host === '0.0.0.0' || this.grpc.host === '::' ? hostname() : this.grpc.host);
    yield {
      // Behind a sidecar, the others reach the instance at the sidecar's inbound port, which forwards
      // to the gRPC port.
      instance: {
        service: this.service,
        id: this.instanceId,
        address,
        port: this.settings.sidecarPort ?? this.grpc.port,
        labels: this.settings.labels,
      },
      serving: this.serving(),
    };
    while (!this.stopped) {
      await this.sleep(this.settings.heartbeatMs);
      if (this.stopped) return;
      yield { serving: this.serving() };
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const cancel = this.clock.setTimer(done, ms);
      const previous = this.wake;
      function done() {
        cancel();
        resolve();
      }
      this.wake = () => {
        previous?.();
        done();
      };
    });
  }
}
