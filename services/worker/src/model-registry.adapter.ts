import { createClient, type ServiceClient } from '@infermesh/grpc';
import { type Model, RegistryService, type VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelRegistry } from './model-registry';

export interface RegistryClientOptions {
  address: string;
  workerId: string;
  /** For calls other than downloads. */
  timeoutMs: number;
  downloadTimeoutMs: number;
  maxMessageBytes?: number;
}

/** The registry over gRPC. */
export class GrpcModelRegistry extends ModelRegistry {
  private readonly client: ServiceClient<typeof RegistryService>;

  constructor(private readonly options: RegistryClientOptions) {
    super();
    this.client = createClient(RegistryService, options.address, { maxMessageBytes: options.maxMessageBytes });
  }

  async listModels(): Promise<Model[]> {
    return (await this.client.listModels({}, { timeoutMs: this.options.timeoutMs })).models;
  }

  async *download(sha256: string, signal: AbortSignal): AsyncIterable<Uint8Array> {
    for await (const message of this.client.downloadArtifact(
      { sha256 },
      { timeoutMs: this.options.downloadTimeoutMs, signal },
    )) {
      yield message.chunk;
    }
  }

  async reportState(name: string, state: VersionState, reason: string, warmUpError = ''): Promise<void> {
    await this.client.reportVersionState(
      { name, state, stateReason: reason, workerId: this.options.workerId, warmUpError },
      { timeoutMs: this.options.timeoutMs },
    );
  }

  close(): void {
    this.client.close();
  }
}
