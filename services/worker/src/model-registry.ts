import type { Model, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** The worker's view of the registry: what to load, the artifacts, and where to report. */
export abstract class ModelRegistry {
  /**
   * Every model the registry holds, with its versions, asked now. ModelSync reads the registry watch
   * instead while it is connected.
   */
  abstract listModels(): Promise<Model[]>;
  /** An artifact's bytes, chunk by chunk. */
  abstract download(sha256: string, signal: AbortSignal): AsyncIterable<Uint8Array>;
  /** Tells the registry the state of a version on this worker; with READY, why it was not warmed up ('' when it was). */
  abstract reportState(name: string, state: VersionState, reason: string, warmUpError?: string): Promise<void>;
  /** Closes connections. */
  abstract close(): void;
}
