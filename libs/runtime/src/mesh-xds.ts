import { channelCredentials, secureChannelOptions } from '@infermesh/grpc';
import { AdsClient, EnvoyApi } from '@infermesh/mesh';
import type { JsonLogger, Metrics } from '@infermesh/telemetry';
import { hostname } from 'node:os';
import type { MeshSettings } from './runtime-config';

/** The service's name in the mesh: INFERMESH_INSTANCE_ID, or `<service>-<host>-<pid>`. */
export function meshInstanceId(service: string, settings: MeshSettings | undefined): string {
  return settings?.instanceId ?? `${service}-${hostname()}-${process.pid}`;
}

/**
 * The service's own xDS stream to the mesh's control plane (in the mesh only; undefined `client`
 * otherwise), for what grpc-js-xds does not take itself: the service's inbound listener (the faults
 * the policy injects into its calls), and what a component watches (the batcher: the workers' edge).
 * Components add their watches before the service starts listening; the stream opens then.
 */
export class MeshXds {
  readonly client: AdsClient | undefined;

  constructor(service: string, settings: MeshSettings | undefined, logger: JsonLogger, metrics: Metrics) {
    if (settings === undefined) return;
    let outage = false;
    const events = metrics.counter(
      'xds_client_events_total',
      "Events of this service's own xDS stream: ACKs, NACKs (the update was refused; the last one stays), disconnections.",
      ['event', 'type'],
    );
    // With mutual TLS, the control plane is the registry and proves it.
    const security = {
      credentials: channelCredentials(settings.controlPlane, 'registry'),
      options: secureChannelOptions(settings.controlPlane, 'registry'),
    };
    this.client = new AdsClient(
      EnvoyApi.load(),
      settings.controlPlane,
      { id: meshInstanceId(service, settings), cluster: service },
      (event) => {
        switch (event.kind) {
          case 'ack':
          case 'nack':
            events.inc({ event: event.kind, type: event.typeUrl.split('.').at(-1)! });
            if (event.kind === 'nack')
              logger.warn('refused an xDS update from the mesh control plane; the last one stays', {
                type: event.typeUrl,
                version: event.version,
                error: event.error,
              });
            break;
          case 'connected':
            events.inc({ event: 'connected', type: '' });
            if (outage)
              logger.info('xDS stream to the mesh control plane open again', { control_plane: settings.controlPlane });
            outage = false;
            break;
          case 'disconnected':
            events.inc({ event: 'disconnected', type: '' });
            // Once per outage: the stream is opened again with backoff until the control plane answers.
            if (!outage)
              logger.warn('xDS stream to the mesh control plane broke; opening it again until it answers', {
                control_plane: settings.controlPlane,
                err: event.error,
              });
            outage = true;
            break;
        }
      },
      security,
    );
  }

  start(): void {
    this.client?.start();
  }

  close(): void {
    this.client?.close();
  }
}
