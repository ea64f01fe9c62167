import { Injectable } from '@nestjs/common';
import { HealthService, ServingStatus } from '@infermesh/grpc';
import { HealthDetails } from '@infermesh/runtime';
import { UpstreamHealth } from './upstreams/upstream-health.client';

/** The version the gateway reports; a spec keeps it equal to package.json's. */
export const SERVER_VERSION = '0.1.0';

/** KServe v2 extensions the gateway implements. */
export const SERVER_EXTENSIONS = ['model_repository', 'parameters', 'binary_tensor_data'] as const;

/** The upstream the data plane needs: inference goes through it, and it serves from its last configuration while the registry is away. */
export const DATA_PLANE_UPSTREAM = 'router';

export interface ServerMetadata {
  name: string;
  version: string;
  extensions: string[];
}

/**
 * Server metadata, liveness and readiness. Readiness says what the data plane can do: the gateway
 * serves (started, not draining) and its router answers. The registry is not part of it: while it is
 * away the router serves from the last configuration it saw, and only the admin API and metadata
 * lookups fail. Its state is a detail, `upstreams` in the service's GET /health on the metrics port.
 */
@Injectable()
export class ServerStatus {
  constructor(
    private readonly health: HealthService,
    private readonly upstreams: UpstreamHealth,
    details: HealthDetails,
  ) {
    details.register('upstreams', () => this.upstreams.lastKnown() ?? { probed: false });
  }

  metadata(): ServerMetadata {
    return { name: 'infermesh', version: SERVER_VERSION, extensions: [...SERVER_EXTENSIONS] };
  }

  /** Ready when the gateway itself serves (started, not draining) and its router answers SERVING. */
  async ready(): Promise<boolean> {
    if (this.health.get('') !== ServingStatus.SERVING) return false;
    return this.upstreams.serving(DATA_PLANE_UPSTREAM);
  }
}
