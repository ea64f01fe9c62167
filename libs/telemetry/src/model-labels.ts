/** The label value of every model or version name the service does not know: one series for all of them. */
export const UNKNOWN_LABEL = '(unknown)';

/** How many model versions a ServedModels remembers; beyond it the least recently served are forgotten. */
export const SERVED_MODELS_CAPACITY = 4_096;

/** What a service knows of the registered models: which names may become label values. */
export interface KnownModels {
  /** Whether the model (its id, "mlp") is registered. */
  hasModel(model: string): boolean;
  /** Whether the model has a version with this id. */
  hasVersion(model: string, version: string): boolean;
}

/**
 * Label values for model and version names. A name becomes a label value only when the service
 * knows the model (or the model's version) is registered; any other name a caller sends, a typo, a
 * probe or a 15,000-character string, is `(unknown)`. So the series per metric stay bounded by the
 * models registered, and the metrics show no tenant what another one asked for. An empty version
 * (none asked for, or none resolved) stays empty. Every service labels metrics with models through
 * this one class.
 */
export class ModelLabels {
  constructor(private readonly known: KnownModels) {}

  model(model: string): string {
    return this.known.hasModel(model) ? model : UNKNOWN_LABEL;
  }

  version(model: string, version: string): string {
    return version === '' ? '' : this.known.hasVersion(model, version) ? version : UNKNOWN_LABEL;
  }

  /** The `model` and `version` labels of a model version. */
  of(model: string, version: string): { model: string; version: string } {
    return { model: this.model(model), version: this.version(model, version) };
  }
}

/**
 * Models known from a trusted upstream's answers, for a service that does not follow the registry:
 * the model versions that upstream served (it resolved them against the registry). At most
 * SERVED_MODELS_CAPACITY versions are remembered, the least recently served forgotten first.
 */
export class ServedModels implements KnownModels {
  /** Versions by model, each model's entry moved last when served again. */
  private readonly models = new Map<string, Set<string>>();
  private versions = 0;

  constructor(private readonly capacity = SERVED_MODELS_CAPACITY) {}

  /** The upstream served this model version. */
  remember(model: string, version: string): void {
    let versions = this.models.get(model);
    if (versions !== undefined) this.models.delete(model);
    versions ??= new Set();
    this.models.set(model, versions);
    if (version === '' || versions.has(version)) return;
    versions.add(version);
    this.versions += 1;
    for (const [oldest, dropped] of this.models) {
      if (this.versions <= this.capacity || oldest === model) break;
      this.models.delete(oldest);
      this.versions -= dropped.size;
    }
  }

  /** Forgets every model. */
  clear(): void {
    this.models.clear();
    this.versions = 0;
  }

  hasModel(model: string): boolean {
    return this.models.has(model);
  }

  hasVersion(model: string, version: string): boolean {
    return this.models.get(model)?.has(version) === true;
  }
}
