import { type HealthService, ServingStatus } from '@infermesh/grpc';

/** A section of the health details: a JSON-serialisable object, computed each time it is read. */
export type HealthSection = () => Record<string, unknown>;

/**
 * What a service says about its health beyond SERVING / NOT_SERVING: its gRPC health status plus the
 * sections its components register (the registry watch: connected or serving the last configuration
 * it saw, since when). Served as JSON at GET /health on the metrics port.
 */
export class HealthDetails {
  private readonly sections = new Map<string, HealthSection>();

  constructor(
    private readonly service: string,
    private readonly health: HealthService,
  ) {}

  /** Adds a named section; a name is registered once. */
  register(name: string, section: HealthSection): void {
    if (name === 'service' || name === 'status')
      throw new Error(`"${name}" is not a health section name: it is a field of the report`);
    if (this.sections.has(name)) throw new Error(`the health section "${name}" is registered already`);
    this.sections.set(name, section);
  }

  unregister(name: string): void {
    this.sections.delete(name);
  }

  /** The server's gRPC health status, e.g. "SERVING". */
  get status(): string {
    const value = this.health.get('');
    return value === ServingStatus.SERVICE_UNKNOWN ? 'UNKNOWN' : (ServingStatus[value] ?? String(value));
  }

  /** {"service": ..., "status": "SERVING", <section>: {...}, ...}; a section that throws reports its error. */
  report(): Record<string, unknown> {
    const report: Record<string, unknown> = { service: this.service, status: this.status };
    for (const [name, section] of this.sections) {
      try {
        report[name] = section();
      } catch (error) {
        report[name] = { error: error instanceof Error ? error.message : String(error) };
      }
    }
    return report;
  }
}
