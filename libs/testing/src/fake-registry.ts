import { clone, create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import { type Clock, systemClock } from '@infermesh/clock';
import { type CallContext, Errors, GrpcServer, type ServiceImpl } from '@infermesh/grpc';
import {
  AutoRolloutPhase,
  AutoRolloutSchema,
  type Model,
  ModelSchema,
  ModelVersionSchema,
  RegistryService,
  RolloutDecision,
  RolloutEventSchema,
  RolloutPolicySchema,
  VersionState,
  type WatchModelsRequest,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf, modelNameOf, stableVersion, versionIdOf } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { createHash } from 'node:crypto';
import { EventEmitter, on } from 'node:events';

type RegistryImpl = ServiceImpl<typeof RegistryService>;
type MethodName = keyof RegistryImpl;
type AnyHandler = (input: unknown, ctx: CallContext) => unknown;

export interface FakeRegistryOptions {
  /**
   * Handlers that replace the fake's own (for a method it does not serve, or to script an answer);
   * also settable later through `handlers`.
   */
  handlers?: Partial<RegistryImpl>;
  /** WatchModels answers UNIMPLEMENTED until the first change, as a registry without the watch would. */
  watchOnlyOnceChanged?: boolean;
  /**
   * Only callers presenting `authorization: Bearer <apiKey>` are served, as on the gateway's admin API;
   * the others are refused UNAUTHENTICATED. Unset: every caller is served.
   */
  apiKey?: string;
  /** Adds other services to the same server (the gateway's ApiKeyService beside the admin API, say). */
  serveAlso?: (server: GrpcServer) => void;
  /** The time of created versions and rollout decisions; systemClock by default. */
  clock?: Clock;
}

/** A call the registry received: the method, the request as decoded, and its authorization header. */
export interface RecordedCall {
  method: string;
  request: unknown;
  authorization: string | undefined;
}

/** An upload as it arrived: the size of each chunk and the expected_sha256 values sent with it. */
export interface RecordedUpload {
  chunkSizes: number[];
  expectedSha256: string[];
}

/** What a decision of the registry's automatic rollout says besides itself. */
export interface FakeDecision {
  reason?: string;
  figures?: MessageInitShape<typeof RolloutEventSchema>['figures'];
  /** Epoch milliseconds; default the clock's now. */
  atMs?: number;
}

/** The phase an automatic rollout is in after a decision. */
const PHASE_AFTER: Record<RolloutDecision, AutoRolloutPhase> = {
  [RolloutDecision.UNSPECIFIED]: AutoRolloutPhase.UNSPECIFIED,
  [RolloutDecision.STARTED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.ADVANCED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.RESUMED]: AutoRolloutPhase.PROGRESSING,
  [RolloutDecision.PAUSED]: AutoRolloutPhase.PAUSED,
  [RolloutDecision.PROMOTED]: AutoRolloutPhase.PROMOTED,
  [RolloutDecision.ROLLED_BACK]: AutoRolloutPhase.ROLLED_BACK,
  [RolloutDecision.ABORTED]: AutoRolloutPhase.ABORTED,
};

/**
 * The registry as its contract says, for the specs of what calls it (the registry is another service;
 * its own specs test its side), served by the real GrpcServer over a real socket:
 *
 * - WatchModels: the first message is a snapshot, or an empty message when the follower's revision
 *   is current; then one message per change (put, delete, and every change the methods below make).
 * - The admin API in memory, as the CLI sees it through the gateway: uploads hashed and kept, versions
 *   created, models read, updated and deleted, versions retired, rollout policies set, automatic
 *   rollouts started, paused and resumed. Versions change state only when a spec says so
 *   (setVersionState), as a worker would report it; the steps of an automatic rollout are the spec's
 *   to decide (decide).
 * - Every other method (ResolveModelVersion, ReportVersionState, DownloadArtifact, SetCachePolicy,
 *   ReportTraffic, QuantizeModelVersion) answers UNIMPLEMENTED unless `handlers` has one for it.
 *
 * Every call is recorded with its authorization header; with `apiKey`, only callers presenting it are
 * served. Errors carry the reasons the real registry gives.
 */
export class FakeRegistry {
  /** The models held, by resource name, each as its last change left it. */
  readonly models = new Map<string, Model>();
  /** Handlers that take the place of the fake's own, by method. */
  readonly handlers: Partial<RegistryImpl>;
  /** Every call received, in order, refused ones too. */
  readonly calls: RecordedCall[] = [];
  /** The from_revision of every WatchModels call served, in order. */
  readonly watchCalls: bigint[] = [];
  /** Every upload received, in order. */
  readonly uploads: RecordedUpload[] = [];
  /** The artifacts stored, by SHA-256. */
  readonly artifacts = new Map<string, Uint8Array>();
  /** WatchModels streams open now. */
  open = 0;
  /** The revision of the last change; 0n before any. */
  revision = 0n;
  /** The port it listens on once started (kept after stop, to start again on it). */
  port = 0;
  /** Runs once a watch has sent its first message: where a spec changes what the follower sees next. */
  afterSnapshot: ((registry: FakeRegistry) => void) | undefined;
  /** Runs before GetModel answers: where a spec makes the registry's rollout decisions as a follower polls. */
  beforeGetModel: ((registry: FakeRegistry) => void) | undefined;
  private readonly changes = new EventEmitter();
  private readonly clock: Clock;
  private server: GrpcServer | undefined;
  private rollouts = 0;

  constructor(private readonly options: FakeRegistryOptions = {}) {
    this.handlers = { ...options.handlers };
    this.clock = options.clock ?? systemClock;
  }

  /** Where it listens, as a client dials it. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Stores a model (at the next revision) and sends it to the followers. */
  put(init: MessageInitShape<typeof ModelSchema>): Model {
    const model = create(ModelSchema, { ...init });
    this.models.set(model.name, model);
    this.changed(model);
    return model;
  }

  /** Deletes a model (at the next revision) and tells the followers. */
  delete(name: string): void {
    this.revision += 1n;
    this.models.delete(name);
    this.changes.emit('change', create(WatchModelsResponseSchema, { revision: this.revision, deleted: [name] }));
  }

  /** What a worker reports: the version (models/m/versions/v) is now in `state`. */
  setVersionState(versionName: string, state: VersionState, reason = '', warmUpError = ''): void {
    const model = this.models.get(modelNameOf(versionName));
    const version = model?.versions.find((v) => v.name === versionName);
    if (model === undefined || version === undefined) throw new Error(`no version ${versionName}`);
    version.state = state;
    version.stateReason = reason;
    version.warmUpError = warmUpError;
    this.changed(model);
  }

  /**
   * A decision of the model's automatic rollout, as the registry's analysis would make it: the
   * rollout's phase follows, ADVANCED moves it to the next step (its share becomes the canary's),
   * and the decision joins the model's history with the figures given.
   */
  decide(modelName: string, decision: RolloutDecision, details: FakeDecision = {}): void {
    const model = this.existing(modelName);
    const rollout = model.autoRollout;
    if (rollout === undefined) throw new Error(`${modelName} has no automatic rollout`);
    const at = timestampFromMs(details.atMs ?? this.clock.now());
    if (decision === RolloutDecision.ADVANCED) {
      rollout.step += 1;
      rollout.stepStartTime = at;
      if (model.rollout?.canary !== undefined)
        model.rollout.canary.percent = rollout.analysis?.steps[rollout.step] ?? 100;
    }
    rollout.phase = PHASE_AFTER[decision];
    rollout.reason = details.reason ?? '';
    rollout.updateTime = at;
    const event = create(RolloutEventSchema, {
      time: at,
      rolloutId: rollout.id,
      version: rollout.canaryVersion,
      decision,
      step: rollout.step,
      percent: rollout.analysis?.steps[rollout.step] ?? 0,
      reason: rollout.reason,
      ...(details.figures !== undefined && { figures: details.figures }),
    });
    if (event.figures !== undefined) rollout.figures = event.figures;
    // The trial ends: the canary takes everything, or nothing and is marked with the reason.
    if (decision === RolloutDecision.PROMOTED)
      model.rollout = create(RolloutPolicySchema, { stableVersion: rollout.canaryVersion });
    if (decision === RolloutDecision.ROLLED_BACK) {
      model.rollout = create(RolloutPolicySchema, { stableVersion: rollout.stableVersion });
      const canary = model.versions.find((v) => versionIdOf(v.name) === rollout.canaryVersion);
      if (canary !== undefined) canary.rollbackReason = rollout.reason;
    }
    model.rolloutHistory.push(event);
    this.changed(model);
  }

  /** The requests of one method, in order. */
  requests<T>(method: MethodName): T[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.request as T);
  }

  /** Listens on 127.0.0.1 at `port`, by default one the system picks. */
  async start(port = 0): Promise<this> {
    this.server = new GrpcServer({
      logger: new JsonLogger('registry', 'error', () => undefined),
      metrics: new Metrics('fake_registry'),
      maxMessageBytes: 8 * 1024 * 1024,
    });
    this.server.add(RegistryService, this.served());
    this.options.serveAlso?.(this.server);
    this.port = await this.server.listen('127.0.0.1', port);
    return this;
  }

  /** Stops at once, cutting the open streams. */
  async stop(): Promise<void> {
    await this.server?.shutdown(1);
    this.server = undefined;
  }

  /**
   * Every method of RegistryService: the call recorded and admitted, then answered by `handlers`, by
   * the fake's own, or refused UNIMPLEMENTED; looked up at each call, so that a spec may set a
   * handler after the start.
   */
  private served(): RegistryImpl {
    const impl: Record<string, AnyHandler> = {};
    for (const method of RegistryService.methods) {
      const name = method.localName as MethodName;
      const handler = (): AnyHandler => this.handlerOf(name, method.name);
      switch (method.methodKind) {
        case 'unary':
          impl[name] = async (request, ctx) => {
            this.admit(name, request, ctx);
            return handler()(request, ctx);
          };
          break;
        case 'client_streaming':
          impl[name] = async (requests, ctx) => {
            this.admit(name, {}, ctx);
            return handler()(requests, ctx);
          };
          break;
        case 'server_streaming':
          impl[name] = (request, ctx) => this.stream(name, request, handler, request, ctx);
          break;
        case 'bidi_streaming':
          impl[name] = (requests, ctx) => this.stream(name, {}, handler, requests, ctx);
          break;
      }
    }
    return impl as unknown as RegistryImpl;
  }

  private async *stream(
    name: MethodName,
    recorded: unknown,
    handler: () => AnyHandler,
    input: unknown,
    ctx: CallContext,
  ): AsyncGenerator<unknown> {
    this.admit(name, recorded, ctx);
    yield* handler()(input, ctx) as AsyncIterable<unknown>;
  }

  private handlerOf(name: MethodName, methodName: string): AnyHandler {
    const handler = (this.handlers[name] ?? this.own[name]) as AnyHandler | undefined;
    if (handler !== undefined) return handler;
    return () => {
      throw Errors.notImplemented(`${methodName} is not served by this fake registry`);
    };
  }

  private admit(method: MethodName, request: unknown, ctx: CallContext): void {
    const authorization = ctx.metadata['authorization'];
    this.calls.push({ method, request, authorization });
    if (this.options.apiKey !== undefined && authorization !== `Bearer ${this.options.apiKey}`)
      throw Errors.unauthenticated('invalid API key');
  }

  /** The methods the fake serves itself. */
  private readonly own: Partial<RegistryImpl> = {
    watchModels: (request, ctx) => this.watch(request, ctx.signal),

    uploadArtifact: async (requests) => {
      const upload: RecordedUpload = { chunkSizes: [], expectedSha256: [] };
      const parts: Uint8Array[] = [];
      for await (const request of requests) {
        if (request.chunk.byteLength > 0) {
          upload.chunkSizes.push(request.chunk.byteLength);
          parts.push(request.chunk);
        }
        if (request.expectedSha256 !== '') upload.expectedSha256.push(request.expectedSha256);
      }
      this.uploads.push(upload);
      const bytes = Buffer.concat(parts);
      const sha256 = createHash('sha256').update(bytes).digest('hex');
      const expected = upload.expectedSha256[upload.expectedSha256.length - 1];
      if (expected !== undefined && expected !== sha256) {
        throw Errors.invalidArtifact(`the uploaded bytes hash to ${sha256}, not the expected_sha256 ${expected}`);
      }
      this.artifacts.set(sha256, bytes);
      return { artifact: { sha256, sizeBytes: BigInt(bytes.byteLength), format: 'onnx' } };
    },

    createModelVersion: async (request) => {
      const artifact = this.artifacts.get(request.artifactSha256);
      if (artifact === undefined)
        throw Errors.artifactNotFound(`no artifact ${request.artifactSha256}`, {
          metadata: { sha256: request.artifactSha256 },
        });
      const model =
        this.models.get(request.parent) ?? create(ModelSchema, { name: request.parent, platform: 'onnxruntime_onnx' });
      const name = `${request.parent}/versions/${request.versionId}`;
      if (model.versions.some((v) => v.name === name))
        throw Errors.alreadyExists(`${name} exists`, { metadata: { version: name } });
      const version = create(ModelVersionSchema, {
        name,
        state: VersionState.REGISTERED,
        artifact: { sha256: request.artifactSha256, sizeBytes: BigInt(artifact.byteLength), format: 'onnx' },
        signature: { maxBatchSize: request.maxBatchSize ?? 0 },
        createTime: timestampFromMs(this.clock.now()),
      });
      model.versions.push(version);
      this.models.set(model.name, model);
      this.changed(model);
      return { version };
    },

    getModel: async (request) => {
      this.beforeGetModel?.(this);
      return { model: this.existing(request.name) };
    },

    listModels: async () => ({ models: [...this.models.values()] }),

    updateModel: async (request) => {
      const given = request.model ?? create(ModelSchema);
      const model = this.existing(given.name);
      for (const path of request.updateMask?.paths ?? []) {
        switch (path) {
          case 'labels':
            model.labels = { ...given.labels };
            break;
          case 'pinned':
            model.pinned = given.pinned;
            break;
          case 'version_policy':
            model.versionPolicy = given.versionPolicy;
            break;
          case 'unloaded':
            model.unloaded = given.unloaded;
            break;
          default:
            throw Errors.invalidRequest(`update_mask: "${path}" cannot be updated`);
        }
      }
      this.changed(model);
      return { model };
    },

    retireModelVersion: async (request) => {
      const model = this.existing(modelNameOf(request.name));
      const version = model.versions.find((v) => v.name === request.name);
      if (version === undefined)
        throw Errors.versionNotFound(`no version ${request.name}`, { metadata: { version: request.name } });
      version.state = version.state === VersionState.READY ? VersionState.DRAINING : VersionState.RETIRED;
      this.changed(model);
      return { version };
    },

    deleteModel: async (request) => {
      this.existing(request.name);
      this.delete(request.name);
      return {};
    },

    setRolloutPolicy: async (request) => {
      const model = this.existing(request.model);
      model.rollout = request.policy;
      this.changed(model);
      return { model };
    },

    updateRollout: async (request) => {
      const model = this.existing(request.model);
      if (request.action.case === 'pause') {
        if (model.autoRollout?.phase !== AutoRolloutPhase.PROGRESSING) {
          throw Errors.noRolloutInProgress(`model "${modelIdOf(model.name)}" has no automatic rollout in progress`, {
            metadata: { model: modelIdOf(model.name) },
          });
        }
        this.decide(model.name, RolloutDecision.PAUSED, { reason: 'paused by UpdateRollout' });
      }
      return { model };
    },

    /** Starts an automatic rollout at its first step (the version READY), or resumes a paused one; the steps after are the spec's to decide. */
    startAutoRollout: async (request) => {
      const model = this.existing(request.model);
      const id = modelIdOf(model.name);
      if (request.resume) {
        if (model.autoRollout?.phase !== AutoRolloutPhase.PAUSED)
          throw Errors.noPausedRollout(`model "${id}" has no paused automatic rollout`, { metadata: { model: id } });
        this.decide(model.name, RolloutDecision.RESUMED, { reason: 'resumed by StartAutoRollout' });
        return { model };
      }
      const version = model.versions.find((v) => versionIdOf(v.name) === request.version);
      if (version === undefined)
        throw Errors.versionNotFound(`model "${id}" has no version ${request.version}`, {
          metadata: { model: id, version: request.version },
        });
      if (version.state !== VersionState.READY)
        throw Errors.versionNotReady(`version ${request.version} of model "${id}" is not READY`, {
          metadata: { model: id, version: request.version },
        });
      const stable = stableVersion(model);
      const now = timestampFromMs(this.clock.now());
      model.autoRollout = create(AutoRolloutSchema, {
        id: `rollout-${++this.rollouts}`,
        canaryVersion: request.version,
        stableVersion: stable === undefined ? '' : versionIdOf(stable.name),
        ...(request.analysis !== undefined && { analysis: request.analysis }),
        phase: AutoRolloutPhase.PROGRESSING,
        startTime: now,
        stepStartTime: now,
      });
      model.rollout = create(RolloutPolicySchema, {
        stableVersion: model.autoRollout.stableVersion,
        canary: { version: request.version, percent: request.analysis?.steps[0] ?? 100 },
      });
      this.decide(model.name, RolloutDecision.STARTED, {
        reason: `waiting for ${request.analysis?.minRequests ?? 0n} canary requests`,
      });
      return { model };
    },
  };

  private async *watch(request: WatchModelsRequest, signal: AbortSignal): AsyncGenerator<WatchModelsResponse> {
    if (this.options.watchOnlyOnceChanged === true && this.revision === 0n)
      throw Errors.notImplemented('no watch in this test');
    const { fromRevision } = request;
    this.watchCalls.push(fromRevision);
    this.open += 1;
    // Listening before the first message: no change falls between the snapshot and the stream.
    const changes = on(this.changes, 'change', { signal });
    try {
      yield fromRevision !== 0n && fromRevision === this.revision
        ? create(WatchModelsResponseSchema, { revision: this.revision })
        : create(WatchModelsResponseSchema, {
            revision: this.revision,
            models: [...this.models.values()].map((m) => clone(ModelSchema, m)),
            snapshot: true,
          });
      this.afterSnapshot?.(this);
      for await (const [change] of changes) yield change as WatchModelsResponse;
    } catch (error) {
      if (!signal.aborted) throw error;
    } finally {
      this.open -= 1;
    }
  }

  private existing(name: string): Model {
    const model = this.models.get(name);
    if (model === undefined)
      throw Errors.modelNotFound(`model "${modelIdOf(name)}" not found`, { metadata: { model: modelIdOf(name) } });
    return model;
  }

  /** The model changed in place: it takes the next revision, and the followers get a copy of it. */
  private changed(model: Model): void {
    this.revision += 1n;
    model.revision = this.revision;
    this.changes.emit(
      'change',
      create(WatchModelsResponseSchema, { revision: this.revision, models: [clone(ModelSchema, model)] }),
    );
  }
}

/** A FakeRegistry, started. */
export function startFakeRegistry(options: FakeRegistryOptions = {}): Promise<FakeRegistry> {
  return new FakeRegistry(options).start();
}
