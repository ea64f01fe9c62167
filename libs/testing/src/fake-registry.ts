import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { GrpcServer, RpcError, type ServiceImpl } from '@infermesh/grpc';
import {
  type Model,
  ModelSchema,
  RegistryService,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { EventEmitter, on } from 'node:events';

type RegistryImpl = ServiceImpl<typeof RegistryService>;

export interface FakeRegistryOptions {
  /** Handlers for the methods a spec needs besides WatchModels; every other method answers UNIMPLEMENTED. */
  handlers?: Partial<RegistryImpl>;
  /** WatchModels answers UNIMPLEMENTED until the first change, as a registry without the watch would. */
  watchOnlyOnceChanged?: boolean;
}

/** A handler for every method of RegistryService that refuses the call with UNIMPLEMENTED. */
function unimplemented(): RegistryImpl {
  const refuse = (method: string) =>
    new RpcError(status.UNIMPLEMENTED, `${method} is not served by this fake registry`);
  return Object.fromEntries(
    RegistryService.methods.map((method) => [
      method.localName,
      method.methodKind === 'server_streaming'
        ? async function* () {
            throw refuse(method.name);
          }
        : () => Promise.reject(refuse(method.name)),
    ]),
  ) as unknown as RegistryImpl;
}

/**
 * The registry's WatchModels as its contract says, for the specs of the services that follow it (the
 * registry is another service; its own specs test its side), served by the real GrpcServer over a real
 * socket: the first message is a snapshot, or an empty message when the follower's revision is
 * current; then one message per change (put, delete). The other methods answer UNIMPLEMENTED unless
 * the options give handlers for them.
 */
export class FakeRegistry {
  /** The models held, by resource name, each as its last change left it. */
  readonly models = new Map<string, Model>();
  /** The from_revision of every WatchModels call, in order. */
  readonly watchCalls: bigint[] = [];
  /** WatchModels streams open now. */
  open = 0;
  /** The revision of the last change; 0n before any. */
  revision = 0n;
  /** The port it listens on once started (kept after stop, to start again on it). */
  port = 0;
  private readonly changes = new EventEmitter();
  private server: GrpcServer | undefined;

  constructor(private readonly options: FakeRegistryOptions = {}) {}

  /** Where it listens, as a client dials it. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Stores a model (at the next revision) and sends it to the followers. */
  put(init: MessageInitShape<typeof ModelSchema>): Model {
    this.revision += 1n;
    const model = create(ModelSchema, { ...init, revision: this.revision });
    this.models.set(model.name, model);
    this.changes.emit('change', create(WatchModelsResponseSchema, { revision: this.revision, models: [model] }));
    return model;
  }

  /** Deletes a model (at the next revision) and tells the followers. */
  delete(name: string): void {
    this.revision += 1n;
    this.models.delete(name);
    this.changes.emit('change', create(WatchModelsResponseSchema, { revision: this.revision, deleted: [name] }));
  }

  /** Listens on 127.0.0.1 at `port`, by default one the system picks. */
  async start(port = 0): Promise<this> {
    const impl: RegistryImpl = {
      ...unimplemented(),
      ...this.options.handlers,
      watchModels: (request, ctx) => this.watch(request.fromRevision, ctx.signal),
    };
    this.server = new GrpcServer({
      logger: new JsonLogger('registry', 'error', () => undefined),
      metrics: new Metrics('fake_registry'),
      maxMessageBytes: 1 << 20,
    });
    this.server.add(RegistryService, impl);
    this.port = await this.server.listen('127.0.0.1', port);
    return this;
  }

  /** Stops at once, cutting the open streams. */
  async stop(): Promise<void> {
    await this.server?.shutdown(1);
    this.server = undefined;
  }

  private async *watch(fromRevision: bigint, signal: AbortSignal): AsyncGenerator<WatchModelsResponse> {
    if (this.options.watchOnlyOnceChanged === true && this.revision === 0n)
      throw new RpcError(status.UNIMPLEMENTED, 'no watch in this test');
    this.watchCalls.push(fromRevision);
    this.open += 1;
    // Listening before the first message: no change falls between the snapshot and the stream.
    const changes = on(this.changes, 'change', { signal });
    try {
      yield fromRevision !== 0n && fromRevision === this.revision
        ? create(WatchModelsResponseSchema, { revision: this.revision })
        : create(WatchModelsResponseSchema, {
            revision: this.revision,
            models: [...this.models.values()],
            snapshot: true,
          });
      for await (const [change] of changes) yield change as WatchModelsResponse;
    } catch (error) {
      if (!signal.aborted) throw error;
    } finally {
      this.open -= 1;
    }
  }
}

/** A FakeRegistry, started. */
export function startFakeRegistry(options: FakeRegistryOptions = {}): Promise<FakeRegistry> {
  return new FakeRegistry(options).start();
}
