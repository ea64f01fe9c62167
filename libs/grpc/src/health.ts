import { EventEmitter, on } from 'node:events';
import {
  type HealthCheckRequest,
  HealthCheckResponse_ServingStatus as ServingStatus,
  type Health,
} from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import type { CallContext, ServiceImpl } from './method-types';
import { Errors } from './rpc-error';

export { ServingStatus };

/**
 * The standard grpc.health.v1 service. The empty service name is the server as a whole; each gRPC
 * service a process hosts has its own entry. Statuses change as the process starts, loses an
 * upstream it cannot work without, or drains.
 */
export class HealthService implements ServiceImpl<typeof Health> {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly changes = new EventEmitter();

  constructor() {
    this.changes.setMaxListeners(0);
  }

  set(service: string, value: ServingStatus): void {
    if (this.statuses.get(service) === value) return;
    this.statuses.set(service, value);
    this.changes.emit('change', service, value);
  }

  /** Sets every registered entry, the server's included. */
  setAll(value: ServingStatus): void {
    if (!this.statuses.has('')) this.statuses.set('', ServingStatus.UNKNOWN);
    for (const service of [...this.statuses.keys()]) this.set(service, value);
  }

  get(service = ''): ServingStatus {
    return this.statuses.get(service) ?? ServingStatus.SERVICE_UNKNOWN;
  }

  async check(request: HealthCheckRequest) {
    const current = this.statuses.get(request.service);
    if (current === undefined) throw Errors.serviceNotFound(`unknown service "${request.service}"`);
    return { status: current };
  }

  async list() {
    const statuses: Record<string, { status: ServingStatus }> = {};
    for (const [service, value] of this.statuses) statuses[service] = { status: value };
    return { statuses };
  }

  async *watch(request: HealthCheckRequest, ctx: CallContext) {
    yield { status: this.get(request.service) };
    try {
      for await (const [service, value] of on(this.changes, 'change', { signal: ctx.signal })) {
        if (service === request.service) yield { status: value as ServingStatus };
      }
    } catch (error) {
      if (!ctx.signal.aborted) throw error;
    }
  }
}
