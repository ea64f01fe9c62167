import { type CallOptions, createClient, type ServiceClient } from '@infermesh/grpc';
import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

/** How long a unary admin call may take unless it says otherwise. */
const DEFAULT_CALL_TIMEOUT_MS = 30_000;

/**
 * The admin API of a gateway: `infermesh.registry.v1.RegistryService` and the gateway's own
 * `infermesh.gateway.v1.ApiKeyService` on its gRPC port, each call carrying `authorization: Bearer <key>`.
 */
export class GatewaySession {
  readonly registry: ServiceClient<typeof RegistryService>;
  readonly apiKeys: ServiceClient<typeof ApiKeyService>;

  constructor(
    readonly address: string,
    private readonly apiKey: string,
  ) {
    this.registry = createClient(RegistryService, address);
    this.apiKeys = createClient(ApiKeyService, address);
  }

  /** Options of a unary call: the key, and a deadline. */
  call(timeoutMs: number = DEFAULT_CALL_TIMEOUT_MS): CallOptions {
    return { timeoutMs, metadata: this.metadata() };
  }

  /** Options of a streaming call, which lasts until it ends or `signal` aborts: the key, no deadline. */
  stream(signal?: AbortSignal): CallOptions {
    return signal === undefined ? { metadata: this.metadata() } : { metadata: this.metadata(), signal };
  }

  close(): void {
    this.registry.close();
    this.apiKeys.close();
  }

  private metadata(): Record<string, string> {
    return { authorization: `Bearer ${this.apiKey}` };
  }
}
