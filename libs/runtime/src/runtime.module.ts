import { type DynamicModule, Global, Module } from '@nestjs/common';
import { Clock, systemClock } from '@infermesh/clock';
import { configureTransportSecurity, HealthService } from '@infermesh/grpc';
import { JsonLogger, Metrics, startTracing } from '@infermesh/telemetry';
import { HealthDetails } from './health-details';
import { MeshXds, meshInstanceId } from './mesh-xds';
import { processTransportSecurity, type RuntimeSettings } from './runtime-config';

/** The settings of the running service, injectable. */
export class ServiceIdentity {
  constructor(
    readonly name: string,
    readonly settings: RuntimeSettings,
  ) {}
}

/**
 * What every service shares: its identity and settings, its JSON logger, its Prometheus metrics, its
 * gRPC health state, the health details its components add to, and its Clock (systemClock; a spec
 * moves time with overrideProvider(Clock).useValue(new ManualClock())). Imported once by each
 * service's root module.
 */
@Global()
@Module({})
export class RuntimeModule {
  static forRoot(name: string, settings: RuntimeSettings): DynamicModule {
    // Before any provider makes a client: every client and server of the process speaks it (behind a
    // sidecar, plaintext: the sidecar speaks mutual TLS for it).
    configureTransportSecurity(processTransportSecurity(settings));
    // Likewise before any span: the spans of every hop go to the collector from the start.
    if (settings.tracing !== undefined) startTracing(name, meshInstanceId(name, settings.mesh), settings.tracing);
    const logger = new JsonLogger(name, settings.logLevel);
    return {
      module: RuntimeModule,
      providers: [
        { provide: ServiceIdentity, useValue: new ServiceIdentity(name, settings) },
        { provide: Clock, useValue: systemClock },
        { provide: JsonLogger, useValue: logger },
        { provide: Metrics, useValue: new Metrics(name) },
        {
          provide: MeshXds,
          inject: [JsonLogger, Metrics],
          useFactory: (log: JsonLogger, metrics: Metrics) => new MeshXds(name, settings.mesh, log, metrics),
        },
        { provide: HealthService, useValue: new HealthService() },
        {
          provide: HealthDetails,
          inject: [HealthService],
          useFactory: (health: HealthService) => new HealthDetails(name, health),
        },
      ],
      exports: [ServiceIdentity, Clock, JsonLogger, Metrics, HealthService, HealthDetails, MeshXds],
    };
  }
}
