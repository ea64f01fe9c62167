import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { timestampNow } from '@bufbuild/protobuf/wkt';
import { Errors, GrpcServer, HealthService, type ServiceImpl, ServingStatus } from '@infermesh/grpc';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import {
  DataType,
  type InferenceRequest,
  type InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Model,
  ModelSchema,
  ModelVersionSchema,
  RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import type { RunningService } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { freePortList, type ManualClock } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadGatewayConfig } from '../gateway.config';
import type { GatewayOptions } from '../gateway.module';
import { startGateway } from '../gateway.start';

// What the gateway's specs run it with. The router and the registry are other services: fakes stand
// in for them, served by the real GrpcServer over real sockets.

export interface FakeRouter {
  requests: { request: InferenceRequest; requestId: string; deadlineMs: number | undefined }[];
  /** What requests for model "held" wait for: they are answered when it resolves, or never while it is unset. */
  hold?: Promise<void>;
}

/**
 * An identity model: every input comes back as an output of the same name, served by version "3".
 * Model "held" is answered only once `state.hold` resolves; its call may end first (its deadline, a cancellation).
 */
export function fakeRouter(state: FakeRouter): Omit<ServiceImpl<typeof RouterService>, 'infers'> {
  return {
    async infer({ request }, ctx) {
      const req = request!;
      state.requests.push({ request: req, requestId: ctx.requestId, deadlineMs: ctx.deadlineMs });
      switch (req.modelName) {
        case 'missing':
          throw Errors.modelNotFound('model "missing" not found');
        case 'busy':
          throw Errors.queueFull('the queue of model "busy" is full', { retryDelayMs: 1500 });
        case 'held':
          await new Promise<void>((resolve) => {
            void state.hold?.then(resolve);
            ctx.signal.addEventListener('abort', () => resolve(), { once: true });
          });
          break;
        case 'strict':
          throw Errors.invalidTensor('input "x" has shape [3] but model "strict" expects [4]');
      }
      const outputs = req.inputs
        .filter((t) => req.outputNames.length === 0 || req.outputNames.includes(t.name))
        .map((t) => ({ name: t.name, datatype: t.datatype, shape: t.shape, data: t.data }));
      const response: MessageInitShape<typeof InferenceResponseSchema> = {
        modelName: req.modelName,
        modelVersion: req.modelVersion === '' ? '3' : req.modelVersion,
        id: req.id,
        outputs,
        parameters: req.parameters,
        cached: req.modelName === 'cached',
        degraded: req.modelName === 'degraded',
      };
      return { response };
    },
  };
}

const version = (model: string, id: string, state: VersionState, reason = '') =>
  create(ModelVersionSchema, {
    name: `models/${model}/versions/${id}`,
    state,
    stateReason: reason,
    createTime: timestampNow(),
    signature: {
      inputs: [{ name: 'input', datatype: DataType.FP32, shape: [-1n, BigInt(Number(id) * 2)] }],
      outputs: [{ name: 'output', datatype: DataType.INT64, shape: [-1n] }],
    },
  });

export const MODELS: Model[] = [
  create(ModelSchema, {
    name: 'models/mlp',
    platform: 'onnxruntime_onnx',
    versions: [
      version('mlp', '1', VersionState.RETIRED),
      version('mlp', '2', VersionState.READY),
      version('mlp', '3', VersionState.LOADING),
    ],
  }),
  create(ModelSchema, {
    name: 'models/broken',
    platform: 'onnxruntime_onnx',
    versions: [version('broken', '1', VersionState.FAILED, 'bad artifact')],
  }),
];

export function fakeRegistry() {
  const find = (name: string) => {
    const model = MODELS.find((m) => m.name === name);
    if (model === undefined) throw Errors.modelNotFound(`model "${name.slice(7)}" not found`);
    return model;
  };
  const notUsed = () => {
    throw Errors.notImplemented('not used by the gateway');
  };
  return {
    uploadArtifact: notUsed,
    downloadArtifact: notUsed,
    createModelVersion: notUsed,
    reportVersionState: notUsed,
    setRolloutPolicy: notUsed,
    updateRollout: notUsed,
    setCachePolicy: notUsed,
    updateModel: notUsed,
    retireModelVersion: notUsed,
    deleteModel: notUsed,
    quantizeModelVersion: notUsed,
    startAutoRollout: notUsed,
    reportTraffic: notUsed,
    watchModels: notUsed,
    async getModel({ name }: { name: string }) {
      return { model: find(name) };
    },
    async listModels() {
      return { models: MODELS };
    },
    async resolveModelVersion({ model, versionId }: { model: string; versionId: string }) {
      const found = find(model);
      if (versionId === '') {
        const ready = found.versions.findLast((v) => v.state === VersionState.READY);
        if (ready === undefined) throw Errors.modelNotReady(`no version of ${model} is ready`);
        return { version: ready };
      }
      const v = found.versions.find((x) => x.name.endsWith(`/versions/${versionId}`));
      if (v === undefined) throw Errors.versionNotFound(`${model} has no version ${versionId}`);
      return { version: v };
    },
  };
}

export interface Upstream {
  address: string;
  health: HealthService;
  stop(): Promise<void>;
}

export async function startUpstream(
  add: (server: GrpcServer) => void,
  typeName: string,
  maxMessageBytes = 1 << 20,
): Promise<Upstream> {
  const server = new GrpcServer({
    logger: new JsonLogger('fake', 'error'),
    metrics: new Metrics('fake'),
    maxMessageBytes,
  });
  const health = new HealthService();
  server.add(Health, health);
  add(server);
  const port = await server.listen('127.0.0.1', 0);
  health.set('', ServingStatus.SERVING);
  health.set(typeName, ServingStatus.SERVING);
  return { address: `127.0.0.1:${port}`, health, stop: () => server.shutdown(100) };
}

/**
 * Moves a gateway's ManualClock on to the wall clock's time. The deadlines the gateway sets reach
 * real gRPC calls, which grpc-js keeps in real time: a spec moves its clock there before each test,
 * and the clock stands still during it unless the spec moves it.
 */
export function catchUpWithWallClock(clock: ManualClock): void {
  clock.advance(Math.max(0, Date.now() - clock.now()));
}

/** The fake router and registry, both serving. */
export interface FakeUpstreams {
  router: Upstream;
  registry: Upstream;
  routerState: FakeRouter;
  stop(): Promise<void>;
}

/** `maxMessageBytes`: the largest message the fake router takes and answers (1 MiB). */
export async function startFakeUpstreams(maxMessageBytes?: number): Promise<FakeUpstreams> {
  const routerState: FakeRouter = { requests: [] };
  const router = await startUpstream(
    (s) => s.add(RouterService, fakeRouter(routerState), { infers: 'infer' }),
    'infermesh.router.v1.RouterService',
    maxMessageBytes,
  );
  const registry = await startUpstream(
    (s) => s.add(RegistryService, fakeRegistry()),
    'infermesh.registry.v1.RegistryService',
  );
  return {
    router,
    registry,
    routerState,
    stop: async () => {
      await router.stop();
      await registry.stop();
    },
  };
}

/**
 * A gateway on free loopback ports in front of `routerAddress` and `registryAddress`, logging errors
 * only, with its own data folder (removed when it stops) unless `env` names one. `env` gives
 * GATEWAY_API_KEYS and anything else to set; `options` its clock.
 */
export async function startTestGateway(
  routerAddress: string,
  registryAddress: string,
  env: Record<string, string>,
  options: GatewayOptions = {},
): Promise<RunningService> {
  const [grpc, metrics, httpPort] = await freePortList(3);
  const dataDir = mkdtempSync(join(tmpdir(), 'gateway-spec-'));
  const config = loadGatewayConfig({
    GATEWAY_ROUTER_ADDRESS: routerAddress,
    GATEWAY_REGISTRY_ADDRESS: registryAddress,
    GATEWAY_GRPC_PORT: String(grpc),
    GATEWAY_METRICS_PORT: String(metrics),
    GATEWAY_HTTP_PORT: String(httpPort),
    GATEWAY_LOG_LEVEL: 'error',
    GATEWAY_SHUTDOWN_GRACE_MS: '200',
    GATEWAY_DATA_DIR: dataDir,
    ...env,
  });
  const gateway = await startGateway(config, options).catch((error: unknown) => {
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  });
  return {
    ...gateway,
    stop: async () => {
      await gateway.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** The body as it came, for binary responses. */
  body: Buffer;
  text: string;
  json: unknown;
}

/** A plain HTTP request, with full control of headers and chunking. */
export function http(
  port: number,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; body?: string | Buffer; chunks?: Buffer[] } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers: options.headers ?? {} }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        const text = body.toString('utf8');
        let json: unknown;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, text, json });
      });
    });
    req.on('error', reject);
    if (options.chunks !== undefined) {
      for (const chunk of options.chunks) req.write(chunk);
      req.end();
    } else req.end(options.body);
  });
}

export const postJson = (port: number, path: string, body: unknown, headers: Record<string, string>) =>
  http(port, 'POST', path, {
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

/** What the gateway's metrics port serves. */
export async function metricsOf(gateway: RunningService): Promise<string> {
  return (await fetch(`http://127.0.0.1:${gateway.metricsPort}/metrics`)).text();
}
