import { Injectable } from '@nestjs/common';
import { HealthService, ServingStatus } from '@infermesh/grpc';
import { UpstreamHealth } from './upstream-health';

/** The version the gateway reports; a spec keeps it equal to package.json's. */
export const SERVER_VERSION = '0.1.0';

/** KServe v2 extensions the gateway implements. */
export const SERVER_EXTENSIONS = ['model_repository', 'parameters', 'binary_tensor_data'] as const;

export interface ServerMetadata {
  name: string;
  version: string;
  extensions: string[];
}

/** Server metadata, liveness and readiness. */
@Injectable()
export class ServerStatus {
  constructor(
    private readonly health: HealthService,
    private readonly upstreams: UpstreamHealth,
  ) {}

  metadata(): ServerMetadata {
    return { name: 'infermesh', version: SERVER_VERSION, extensions: [...SERVER_EXTENSIONS] };
  }

  /** Ready when the gateway itself serves (started, not draining) and its router and registry answer SERVING. */
  async ready(): Promise<boolean> {
    if (this.health.get('') !== ServingStatus.SERVING) return false;
    return this.upstreams.allServing();
  }
}
