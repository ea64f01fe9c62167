import { type Model, type ModelVersion, RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import { type JsonLogger } from '@infermesh/telemetry';
import { upstreamError } from './upstream-errors';

/** The gateway's port to the registry: model metadata for clients, and the admin API's forwarding. */
export class RegistryClient {
  private readonly client: ServiceClient<typeof RegistryService>;

  constructor(
    address: string,
    maxMessageBytes: number,
    private readonly logger: JsonLogger,
  ) {
    this.client = createClient(RegistryService, address, { maxMessageBytes });
  }

  /** A model with all its versions; NOT_FOUND for an unknown model. */
  async getModel(model: string): Promise<Model | undefined> {
    try {
      return (await this.client.getModel({ name: `models/${model}` })).model;
    } catch (error) {
      throw upstreamError('registry', error, this.logger);
    }
  }

  async listModels(): Promise<Model[]> {
    try {
      return (await this.client.listModels({})).models;
    } catch (error) {
      throw upstreamError('registry', error, this.logger);
    }
  }

  /** The version that serves `model` (the latest READY one when `version` is empty). */
  async resolveVersion(model: string, version: string): Promise<ModelVersion | undefined> {
    try {
      return (await this.client.resolveModelVersion({ model: `models/${model}`, versionId: version })).version;
    } catch (error) {
      throw upstreamError('registry', error, this.logger);
    }
  }

  /**
   * Forwards one admin call: `call` gets the registry's client and makes the call, which takes its
   * deadline, request id and cancellation from the ambient request context. Failures are mapped as
   * every upstream failure is: the registry's own errors pass through with their code and ErrorInfo.
   */
  async forward<T>(call: (registry: ServiceClient<typeof RegistryService>) => Promise<T>): Promise<T> {
    try {
      return await call(this.client);
    } catch (error) {
      throw upstreamError('registry', error, this.logger);
    }
  }

  /** Forwards one server-streaming admin call message by message, as `forward` does a unary one. */
  async *forwardStream<T>(
    call: (registry: ServiceClient<typeof RegistryService>) => AsyncIterable<T>,
  ): AsyncGenerator<T> {
    try {
      yield* call(this.client);
    } catch (error) {
      throw upstreamError('registry', error, this.logger);
    }
  }

  close(): void {
    this.client.close();
  }
}
