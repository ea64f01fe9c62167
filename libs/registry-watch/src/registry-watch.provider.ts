import type { FactoryProvider } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { createClient } from '@infermesh/grpc';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { HealthDetails, ServiceIdentity } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { RegistryWatch } from './registry-watch';

/** A RegistryWatch that closes its stream and its channel when the application shuts down. */
class ManagedRegistryWatch extends RegistryWatch {
  constructor(
    options: ConstructorParameters<typeof RegistryWatch>[0],
    private readonly release: () => void,
  ) {
    super(options);
  }

  async onApplicationShutdown(): Promise<void> {
    await this.close();
    this.release();
  }
}

/**
 * The Nest provider of a service's RegistryWatch, following the registry at `address` on a channel
 * of its own from the moment the application is built: it adds the "registry" section to the health
 * details and closes on shutdown.
 */
export function registryWatchProvider(address: string): FactoryProvider<RegistryWatch> {
  return {
    provide: RegistryWatch,
    inject: [JsonLogger, Metrics, HealthDetails, ServiceIdentity, Clock],
    useFactory: (
      logger: JsonLogger,
      metrics: Metrics,
      details: HealthDetails,
      identity: ServiceIdentity,
      clock: Clock,
    ) => {
      const client = createClient(RegistryService, address, { maxMessageBytes: identity.settings.maxMessageBytes });
      const watch = new ManagedRegistryWatch({ client, logger, metrics, address, clock }, () => {
        details.unregister('registry');
        client.close();
      });
      details.register('registry', () => watch.healthSection());
      watch.start();
      return watch;
    },
  };
}
