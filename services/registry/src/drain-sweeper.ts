import { Inject, Injectable, type BeforeApplicationShutdown, type OnApplicationBootstrap } from '@nestjs/common';
import { JsonLogger } from '@infermesh/telemetry';
import { ModelCatalog } from './model-catalog';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';

/**
 * Runs the version lifecycle on a timer, so that DRAINING versions become RETIRED (REGISTERED for an
 * unloaded model) once they have drained for REGISTRY_DRAIN_GRACE_MS, even when nothing else changes.
 * Every registry replica sweeps; the store's atomic updates keep them from undoing each other.
 */
@Injectable()
export class DrainSweeper implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly catalog: ModelCatalog,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
  ) {}

  onApplicationBootstrap(): void {
    this.timer = setInterval(() => this.tick(), this.config.drainSweepIntervalMs);
    this.timer.unref();
  }

  async beforeApplicationShutdown(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  /** One sweep at a time: a tick while one runs is skipped. */
  private tick(): void {
    if (this.running !== undefined) return;
    this.running = this.catalog
      .sweep()
      .then(
        () => undefined,
        (error: unknown) =>
          this.logger.debug('drain sweep failed; trying again', {
            err: error instanceof Error ? error.message : String(error),
          }),
      )
      .finally(() => (this.running = undefined));
  }
}
