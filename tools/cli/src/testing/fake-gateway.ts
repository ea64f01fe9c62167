import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { type FakeRegistry, startFakeRegistry } from '@infermesh/testing';
import { FakeApiKeys } from './fake-api-keys';

/** The gateway's admin API as the CLI's specs see it: the registry behind it and its own ApiKeyService. */
export interface FakeGateway {
  /** libs/testing's FakeRegistry, serving only callers that present the admin key. */
  registry: FakeRegistry;
  apiKeys: FakeApiKeys;
  /** host:port of its gRPC server. */
  address: string;
  stop(): Promise<void>;
}

/** Serves a FakeRegistry and FakeApiKeys on one free loopback port, both admitting `Bearer <apiKey>`. */
export async function startFakeGateway(apiKey: string): Promise<FakeGateway> {
  const apiKeys = new FakeApiKeys(apiKey);
  const registry = await startFakeRegistry({ apiKey, serveAlso: (server) => server.add(ApiKeyService, apiKeys) });
  return { registry, apiKeys, address: registry.address, stop: () => registry.stop() };
}
