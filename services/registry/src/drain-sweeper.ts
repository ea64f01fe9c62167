import { Inject, Injectable, type BeforeApplicationShutdown, type OnApplicationBootstrap } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
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
  private cancelTimer: (() => void) | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly catalog: ModelCatalog,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    private readonly clock: Clock,
  ) {}

  onApplicationBootstrap(): void {
    this.cancelTimer = this.clock.setRepeatingTimer(() => this.tick(), this.config.drainSweepIntervalMs);
  }

  async beforeApplicationShutdown(): Promise<void> {
    this.cancelTimer?.();
    this.cancelTimer = undefined;
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
