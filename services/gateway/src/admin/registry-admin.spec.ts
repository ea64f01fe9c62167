import { create, type DescMessage, type JsonValue, toJson } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type CallContext,
  createClient,
  Errors,
  GrpcServer,
  type ServiceClient,
  type ServiceImpl,
} from '@infermesh/grpc';
import { GRPCInferenceService } from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  ArtifactSchema,
  ModelSchema,
  ModelVersionSchema,
  RegistryService,
  type UploadArtifactRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { RunningService } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { type Deferred, deferred, eventually, freePortList, ManualClock, rpcRejection } from '@infermesh/testing';
import { createHash } from 'node:crypto';
import { type ClientRequest, request as httpRequest } from 'node:http';
import { loadGatewayConfig } from '../gateway.config';
import { startGateway } from '../gateway.start';
import { catchUpWithWallClock } from '../testing/gateway-harness';
import { RegistryAdminGrpcController } from './registry-admin.grpc';
import { RegistryAdminHttpController } from './registry-admin.http';

const FULL_KEY = 'admin-spec-full-key-0123456789';
const INFER_KEY = 'admin-spec-infer-key-0123456789';
const ADMIN_KEY = 'admin-spec-admin-key-0123456789';
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const ADMIN = bearer(ADMIN_KEY);
/** The gateway's JSON body limit: artifact uploads go past it. */
const MAX_BODY_BYTES = 4096;
/** The fake registry's artifact size limit. */
const MAX_ARTIFACT_BYTES = 1 << 20;

// ---------------------------------------------------------------------------------------------
// A fake registry: the registry is another service, so this stands in for it over a real socket,
// recording what reaches it and answering as scripted.
// ---------------------------------------------------------------------------------------------

const VERSION = create(ModelVersionSchema, {
  name: 'models/mlp/versions/2',
  state: VersionState.READY,
  artifact: { sha256: 'ab'.repeat(32), sizeBytes: 1234n, format: 'onnx' },
});
const MODEL = create(ModelSchema, {
  name: 'models/mlp',
  platform: 'onnxruntime_onnx',
  versions: [VERSION],
  labels: { team: 'search' },
  pinned: true,
  rollout: { stableVersion: '2' },
  revision: 7n,
});
const MODEL_JSON = toJson(ModelSchema, MODEL);
/** What QuantizeModelVersion answers: an int8 variant of VERSION, with its lineage. */
const DERIVED = create(ModelVersionSchema, {
  name: 'models/mlp_int8/versions/4',
  state: VersionState.REGISTERED,
  artifact: { sha256: 'ef'.repeat(32), sizeBytes: 456n, format: 'onnx' },
  lineage: {
    sourceVersion: 'models/mlp/versions/2',
    sourceSha256: 'ab'.repeat(32),
    method: 'dynamic_int8',
    settings: { perChannel: false, quantizeConv: true },
    quantizedNodes: [{ node: 'fc1', opType: 'MatMul', weight: 'fc1.weight', elements: 4096n }],
    floatNodes: [{ node: 'proj', opType: 'MatMul', reason: 'its weight is computed' }],
    accuracy: {
      samples: 1,
      maxAbsDiff: 0.003,
      relativeL2: 0.011,
      comparedItems: 8,
      agreedItems: 8,
      maxRelativeL2: 0.05,
    },
  },
});

interface Seen {
  method: string;
  request: JsonValue;
  requestId: string;
  deadlineMs: number | undefined;
}

interface Upload {
  chunks: Buffer[];
  expectedSha256: string[];
  signal: AbortSignal;
}

interface FakeState {
  seen: Seen[];
  /** Replaces a unary method's answer. */
  script: Record<string, (request: unknown) => Promise<unknown>>;
  uploads: Upload[];
  /** Called with each chunk an upload receives. */
  onChunk?: (upload: Upload) => void;
  /** Uploads keep their call open after their first chunk until it is cancelled. */
  holdUploads: boolean;
  /** DownloadArtifact waits on gate i after sending chunk i, but the last. */
  downloadGates: Deferred[];
  watchCancelled: Deferred;
}

const inputOf = (method: string) =>
  (RegistryService.method as unknown as Record<string, { input: DescMessage }>)[method]!.input;

function fakeRegistry(state: FakeState): ServiceImpl<typeof RegistryService> {
  const record = (method: string, request: unknown, ctx: CallContext) =>
    state.seen.push({
      method,
      request: toJson(inputOf(method), request as never),
      requestId: ctx.requestId,
      deadlineMs: ctx.deadlineMs,
    });
  const unary =
    (method: string, answer: () => unknown) =>
    async (request: unknown, ctx: CallContext): Promise<never> => {
      record(method, request, ctx);
      const scripted = state.script[method];
      return (scripted === undefined ? answer() : await scripted(request)) as never;
    };
  return {
    getModel: unary('getModel', () => ({ model: MODEL })),
    listModels: unary('listModels', () => ({ models: [MODEL] })),
    resolveModelVersion: unary('resolveModelVersion', () => ({ version: VERSION })),
    createModelVersion: unary('createModelVersion', () => ({ version: VERSION })),
    reportVersionState: unary('reportVersionState', () => ({ version: VERSION })),
    setRolloutPolicy: unary('setRolloutPolicy', () => ({ model: MODEL })),
    updateRollout: unary('updateRollout', () => ({ model: MODEL })),
    setCachePolicy: unary('setCachePolicy', () => ({ model: MODEL })),
    updateModel: unary('updateModel', () => ({ model: MODEL })),
    retireModelVersion: unary('retireModelVersion', () => ({ version: { ...VERSION, state: VersionState.RETIRED } })),
    deleteModel: unary('deleteModel', () => ({})),
    quantizeModelVersion: unary('quantizeModelVersion', () => ({ version: DERIVED })),
    startAutoRollout: unary('startAutoRollout', () => ({ model: MODEL })),
    reportTraffic: unary('reportTraffic', () => ({})),
    async uploadArtifact(requests: AsyncIterable<UploadArtifactRequest>, ctx: CallContext) {
      const upload: Upload = { chunks: [], expectedSha256: [], signal: ctx.signal };
      state.uploads.push(upload);
      let size = 0;
      for await (const request of requests) {
        if (request.expectedSha256 !== '') upload.expectedSha256.push(request.expectedSha256);
        if (request.chunk.byteLength === 0) continue;
        upload.chunks.push(Buffer.from(request.chunk));
        size += request.chunk.byteLength;
        state.onChunk?.(upload);
        if (state.holdUploads) {
          await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
          throw Errors.cancelled('the upload was cancelled');
        }
        if (size > MAX_ARTIFACT_BYTES) {
          throw Errors.invalidArtifact(
            `the artifact is larger than the registry's limit of ${MAX_ARTIFACT_BYTES} bytes (REGISTRY_MAX_ARTIFACT_BYTES); nothing was stored`,
            { metadata: { maxBytes: String(MAX_ARTIFACT_BYTES) } },
          );
        }
      }
      const sha256 = createHash('sha256').update(Buffer.concat(upload.chunks)).digest('hex');
      const expected = upload.expectedSha256[0];
      if (expected !== undefined && expected !== sha256) {
        throw Errors.invalidArtifact(
          `the uploaded bytes hash to ${sha256}, not the expected_sha256 ${expected}; nothing was stored`,
        );
      }
      return { artifact: { sha256, sizeBytes: BigInt(size), format: 'onnx' } };
    },
    async *downloadArtifact(request, ctx) {
      record('downloadArtifact', request, ctx);
      if (request.sha256 === 'missing')
        throw Errors.artifactNotFound('artifact "missing" not found', { metadata: { sha256: 'missing' } });
      for (let i = 0; i <= state.downloadGates.length; i++) {
        yield { chunk: Buffer.alloc(1000, i + 1) };
        await state.downloadGates[i]?.promise;
      }
    },
    async *watchModels(request, ctx) {
      record('watchModels', request, ctx);
      yield { revision: 7n, models: [MODEL], snapshot: true };
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
      state.watchCancelled.resolve();
    },
  };
}

// ---------------------------------------------------------------------------------------------
// REST over plain node:http, with control of headers and of when body chunks are sent.
// ---------------------------------------------------------------------------------------------

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: unknown;
}

function send(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string>,
): { req: ClientRequest; reply: Promise<Reply> } {
  let req!: ClientRequest;
  const reply = new Promise<Reply>((resolve, reject) => {
    req = httpRequest({ host: '127.0.0.1', port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: unknown;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
  });
  return { req, reply };
}

function http(
  port: number,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; body?: string | Buffer } = {},
): Promise<Reply> {
  const { req, reply } = send(port, method, path, options.headers ?? ADMIN);
  req.end(options.body);
  return reply;
}

const json = (port: number, method: string, path: string, body: unknown, headers: Record<string, string> = ADMIN) =>
  http(port, method, path, {
    headers: { ...headers, 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

const octets = { ...ADMIN, 'content-type': 'application/octet-stream' };

/** The first message of a stream. */
async function firstOf<T>(stream: AsyncIterable<T>): Promise<T | undefined> {
  for await (const message of stream) return message;
  return undefined;
}

const bytes = (n: number, seed: number) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 31 + seed) % 256));
const sha256Of = (data: Buffer) => createHash('sha256').update(data).digest('hex');

describe('gateway admin API', () => {
  const state: FakeState = {
    seen: [],
    script: {},
    uploads: [],
    holdUploads: false,
    downloadGates: [],
    watchCancelled: deferred(),
  };
  let registryServer: GrpcServer;
  let gateway: RunningService;
  let port: number;
  let admin: ServiceClient<typeof RegistryService>;
  let inference: ServiceClient<typeof GRPCInferenceService>;
  // The gateway's time: it stands still during each test, at the wall clock's time when the test starts.
  const clock = new ManualClock(Date.now());

  beforeAll(async () => {
    registryServer = new GrpcServer({
      logger: new JsonLogger('fake', 'error'),
      metrics: new Metrics('fake'),
      maxMessageBytes: 4 << 20,
    });
    registryServer.add(RegistryService, fakeRegistry(state));
    const registryPort = await registryServer.listen('127.0.0.1', 0);
    const [grpc, metrics, httpPort, router] = await freePortList(4);
    gateway = await startGateway(
      loadGatewayConfig({
        GATEWAY_API_KEYS: `${FULL_KEY}, ${INFER_KEY}:infer, ${ADMIN_KEY}:admin`,
        // Nothing listens there: no admin call goes to the router.
        GATEWAY_ROUTER_ADDRESS: `127.0.0.1:${router}`,
        GATEWAY_REGISTRY_ADDRESS: `127.0.0.1:${registryPort}`,
        GATEWAY_GRPC_PORT: String(grpc),
        GATEWAY_METRICS_PORT: String(metrics),
        GATEWAY_HTTP_PORT: String(httpPort),
        GATEWAY_MAX_BODY_BYTES: String(MAX_BODY_BYTES),
        GATEWAY_LOG_LEVEL: 'error',
        GATEWAY_SHUTDOWN_GRACE_MS: '200',
      }),
      { clock },
    );
    port = gateway.httpPort!;
    admin = createClient(RegistryService, `127.0.0.1:${gateway.grpcPort}`);
    inference = createClient(GRPCInferenceService, `127.0.0.1:${gateway.grpcPort}`);
  });

  beforeEach(() => {
    catchUpWithWallClock(clock);
    state.seen.length = 0;
    state.script = {};
    state.uploads.length = 0;
    state.onChunk = undefined;
    state.holdUploads = false;
    state.downloadGates = [];
    state.watchCancelled = deferred();
  });

  afterAll(async () => {
    admin?.close();
    inference?.close();
    await gateway?.stop();
    await registryServer?.shutdown(100);
  });

  describe(RegistryAdminHttpController.name, () => {
    it.each([
      ['no key', {}, 401, /missing API key/],
      ['a wrong key', bearer('not-a-key-at-all-0123'), 401, /invalid API key/],
      ['an infer-only key', bearer(INFER_KEY), 403, /^this API key lacks the admin scope$/],
    ])('refuses %s on every admin route before the registry hears of it', async (_label, headers, code, message) => {
      const replies = [
        await http(port, 'GET', '/admin/v1/models', { headers }),
        await http(port, 'POST', '/v2/repository/models/mlp/unload', { headers }),
        await json(port, 'PATCH', '/admin/v1/models/mlp', { pinned: true }, headers),
        await json(
          port,
          'POST',
          '/admin/v1/models/mlp/rollout/auto',
          { version: '3', analysis: { steps: [100], intervalMs: '1000', minRequests: '10' } },
          headers,
        ),
        await http(port, 'POST', '/admin/v1/models/mlp/rollout/pause', { headers }),
        await http(port, 'POST', '/admin/v1/artifacts', {
          headers: { ...headers, 'content-type': 'application/octet-stream' },
          body: bytes(20_000, 1),
        }),
      ];
      for (const reply of replies) {
        expect([reply.status, reply.json]).toEqual([code, { error: expect.stringMatching(message) }]);
        expect(reply.text).not.toContain(INFER_KEY);
      }
      expect(state.seen).toEqual([]);
      expect(state.uploads).toEqual([]);
    });

    it('lets keys with the admin scope in, and keeps an admin-only key out of inference and metadata', async () => {
      expect((await http(port, 'GET', '/admin/v1/models', { headers: bearer(ADMIN_KEY) })).status).toBe(200);
      expect((await http(port, 'GET', '/admin/v1/models', { headers: bearer(FULL_KEY) })).status).toBe(200);
      expect((await http(port, 'GET', '/v2/models/mlp', { headers: bearer(INFER_KEY) })).status).toBe(200);
      const seen = state.seen.length;
      const metadata = await http(port, 'GET', '/v2/models/mlp', { headers: bearer(ADMIN_KEY) });
      expect([metadata.status, metadata.json]).toEqual([403, { error: 'this API key lacks the infer scope' }]);
      const infer = await json(port, 'POST', '/v2/models/mlp/infer', { inputs: [] }, bearer(ADMIN_KEY));
      expect(infer.status).toBe(403);
      expect(state.seen).toHaveLength(seen);
    });

    it.each<[string, string, string | undefined, string, JsonValue, unknown]>([
      [
        'POST',
        '/v2/repository/models/mlp/load',
        undefined,
        'updateModel',
        { model: { name: 'models/mlp' }, updateMask: 'unloaded' },
        {},
      ],
      [
        'POST',
        '/v2/repository/models/mlp/unload',
        '{"parameters": {"unload_dependents": false}}',
        'updateModel',
        { model: { name: 'models/mlp', unloaded: true }, updateMask: 'unloaded' },
        {},
      ],
      ['GET', '/admin/v1/models', undefined, 'listModels', {}, { models: [MODEL_JSON] }],
      ['GET', '/admin/v1/models/mlp', undefined, 'getModel', { name: 'models/mlp' }, MODEL_JSON],
      [
        'PATCH',
        '/admin/v1/models/mlp',
        '{"labels": {"team": "ads"}, "version_policy": {"specific": {"versions": ["2"]}}, "pinned": false}',
        'updateModel',
        {
          model: { name: 'models/mlp', labels: { team: 'ads' }, versionPolicy: { specific: { versions: ['2'] } } },
          updateMask: 'labels,versionPolicy,pinned',
        },
        MODEL_JSON,
      ],
      [
        'PATCH',
        '/admin/v1/models/mlp',
        '{"name": "models/mlp", "versionPolicy": null}',
        'updateModel',
        { model: { name: 'models/mlp' }, updateMask: 'versionPolicy' },
        MODEL_JSON,
      ],
      ['DELETE', '/admin/v1/models/mlp', undefined, 'deleteModel', { name: 'models/mlp' }, {}],
      [
        'POST',
        '/admin/v1/models/mlp/versions',
        `{"versionId": "3", "artifact_sha256": "${'cd'.repeat(32)}", "maxBatchSize": 8, "batching": {"maxQueueDelayUs": "500"}}`,
        'createModelVersion',
        {
          parent: 'models/mlp',
          versionId: '3',
          artifactSha256: 'cd'.repeat(32),
          maxBatchSize: 8,
          batching: { maxQueueDelayUs: '500' },
        },
        toJson(ModelVersionSchema, VERSION),
      ],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/retire',
        undefined,
        'retireModelVersion',
        { name: 'models/mlp/versions/2' },
        toJson(ModelVersionSchema, { ...VERSION, state: VersionState.RETIRED }),
      ],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/quantize',
        '{"targetModel": "models/mlp_int8", "version_id": "4", "calibration": [{"name": "s1", "inputs": [{"name": "x", "shape": ["1", "2"], "randomData": true}]}], ' +
          '"maxRelativeL2": 0.05, "settings": {"perChannel": false, "quantize_conv": true}}',
        'quantizeModelVersion',
        {
          source: 'models/mlp/versions/2',
          targetModel: 'models/mlp_int8',
          versionId: '4',
          calibration: [{ name: 's1', inputs: [{ name: 'x', shape: ['1', '2'], randomData: true }] }],
          maxRelativeL2: 0.05,
          settings: { perChannel: false, quantizeConv: true },
        },
        toJson(ModelVersionSchema, DERIVED),
      ],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/quantize',
        '{}',
        'quantizeModelVersion',
        { source: 'models/mlp/versions/2' },
        toJson(ModelVersionSchema, DERIVED),
      ],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/quantize',
        undefined,
        'quantizeModelVersion',
        { source: 'models/mlp/versions/2' },
        toJson(ModelVersionSchema, DERIVED),
      ],
      [
        'PUT',
        '/admin/v1/models/mlp/rollout',
        '{"stableVersion": "2", "canary": {"version": "3", "percent": 10}, "fallbackModel": "tiny"}',
        'setRolloutPolicy',
        {
          model: 'models/mlp',
          policy: { stableVersion: '2', canary: { version: '3', percent: 10 }, fallbackModel: 'tiny' },
        },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/promote',
        '{"version": "3"}',
        'updateRollout',
        { model: 'models/mlp', promote: '3' },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/promote',
        undefined,
        'updateRollout',
        { model: 'models/mlp', promote: '' },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/rollback',
        undefined,
        'updateRollout',
        { model: 'models/mlp', rollback: true },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/weights',
        '{"percents": {"3": 25, "4": 5}}',
        'updateRollout',
        { model: 'models/mlp', setWeights: { percents: { '3': 25, '4': 5 } } },
        MODEL_JSON,
      ],
      [
        'PUT',
        '/admin/v1/models/mlp/cache',
        '{"enabled": false, "ttlMs": "60000"}',
        'setCachePolicy',
        { model: 'models/mlp', policy: { enabled: false, ttlMs: '60000' } },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [5, 10, 25, 50, 100], "intervalMs": 60000, "min_requests": "200", "maxErrorRateIncrease": 0.005, ' +
          '"maxP99Ratio": 1.2, "minAgreement": 0.99, "maxBurnRate": 2, "objective": 99.5}}',
        'startAutoRollout',
        {
          model: 'models/mlp',
          version: '3',
          analysis: {
            steps: [5, 10, 25, 50, 100],
            intervalMs: '60000',
            minRequests: '200',
            maxErrorRateIncrease: 0.005,
            maxP99Ratio: 1.2,
            minAgreement: 0.99,
            maxBurnRate: 2,
            objective: 99.5,
          },
        },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10"}}',
        'startAutoRollout',
        { model: 'models/mlp', version: '3', analysis: { steps: [100], intervalMs: '1000', minRequests: '10' } },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto/resume',
        undefined,
        'startAutoRollout',
        { model: 'models/mlp', resume: true },
        MODEL_JSON,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/pause',
        '{}',
        'updateRollout',
        { model: 'models/mlp', pause: true },
        MODEL_JSON,
      ],
    ])('forwards %s %s %s to %s and answers its message as JSON', async (method, path, body, rpc, expected, answer) => {
      const reply = await http(port, method, path, {
        headers: { ...ADMIN, 'content-type': 'application/json', 'x-request-id': 'admin-rest-1' },
        ...(body !== undefined && { body }),
      });
      expect([reply.status, reply.json]).toEqual([200, answer]);
      expect(state.seen).toEqual([
        { method: rpc, request: expected, requestId: 'admin-rest-1', deadlineMs: expect.any(Number) },
      ]);
    });

    it('gives each call the request deadline: x-request-timeout-ms, else the configured default', async () => {
      await http(port, 'GET', '/admin/v1/models', { headers: { ...ADMIN, 'x-request-timeout-ms': '10000' } });
      await http(port, 'GET', '/admin/v1/models');
      // Each deadline as the gateway set it (its clock stands still), below the next one it could have been.
      const [short, long] = state.seen.map((s) => s.deadlineMs! - clock.now());
      expect(short).toBeGreaterThanOrEqual(10_000);
      expect(short).toBeLessThan(30_000);
      expect(long).toBeGreaterThanOrEqual(30_000);
      expect(long).toBeLessThan(60_000);
    });

    it.each([
      ['PATCH', '/admin/v1/models/mlp', '{"pinned": "yes"}', /Model\.pinned.*expected boolean/],
      ['PATCH', '/admin/v1/models/mlp', '{"bogus": 1}', /"bogus" is unknown/],
      ['PATCH', '/admin/v1/models/mlp', '{"labels": {', /malformed JSON/],
      ['PATCH', '/admin/v1/models/mlp', '{}', /names no field to change/],
      ['PATCH', '/admin/v1/models/mlp', '[]', /must be a JSON object/],
      ['PATCH', '/admin/v1/models/mlp', '{"name": "models/other", "pinned": true}', /path names "models\/mlp"/],
      ['POST', '/admin/v1/models/mlp/versions', '{"parent": "models/x", "versionId": "1"}', /leave "parent" out/],
      ['POST', '/admin/v1/models/mlp/versions', '', /needs a JSON body/],
      ['POST', '/admin/v1/models/mlp/versions', '{"versionId": 1.5}', /versionId|version_id/],
      ['PUT', '/admin/v1/models/mlp/rollout', '{"canary": {"percent": "lots"}}', /percent/],
      ['PUT', '/admin/v1/models/mlp/cache', '"off"', /must be a JSON object/],
      ['POST', '/admin/v1/models/mlp/rollout/weights', '{"percents": {"2": "x"}}', /percents/],
      ['POST', '/admin/v1/models/mlp/rollout/promote', '{"version": 2}', /"version" must be a version id/],
      ['POST', '/admin/v1/models/mlp/rollout/promote', '{"versoin": "2"}', /unknown field "versoin"/],
      ['POST', '/admin/v1/models/mlp/rollout/promote', '{"version": "02"}', /invalid version id "02"/],
      ['POST', '/admin/v1/models/mlp/rollout/rollback', '{"to": "1"}', /takes no body/],
      [
        'POST',
        '/v2/repository/models/mlp/load',
        '{"parameters": {"config": "{}"}}',
        /parameter "config" is not supported/,
      ],
      ['POST', '/v2/repository/models/mlp/load', '{"parameters": 3}', /"parameters" must be a JSON object/],
      ['GET', '/admin/v1/models/bad%20name', '', /invalid model name "bad name"/],
      ['POST', '/admin/v1/models/a%2Fversions%2F1/versions/1/retire', '', /invalid model name "a\/versions\/1"/],
      ['POST', '/admin/v1/models/mlp/versions/x1/retire', '', /invalid version id "x1"/],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/quantize',
        '{"source": "models/other/versions/1"}',
        /^leave "source" out of the request body: the path names the version \("models\/mlp\/versions\/2"\)$/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/versions/2/quantize',
        '{"maxRelativeL2": "lots"}',
        /maxRelativeL2|max_relative_l2/,
      ],
      ['POST', '/admin/v1/models/mlp/versions/x1/quantize', '{}', /invalid version id "x1"/],
      ['POST', '/admin/v1/models/mlp/rollout/auto', '', /needs a JSON body/],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10"}}',
        /^"version" is missing/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": 3, "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10"}}',
        /^"version" must be a version id as a string/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "03", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10"}}',
        /invalid version id "03"/,
      ],
      ['POST', '/admin/v1/models/mlp/rollout/auto', '{"version": "3"}', /^"analysis" is missing/],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": [5, 100]}',
        /^"analysis" must be a JSON object/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10"}, "resume": true}',
        /^unknown field "resume" in the request body: expected "version" and "analysis"$/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "intervall": 5}}',
        /"intervall" is unknown/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": "5,100"}}',
        /AutoRolloutAnalysis\.steps/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"intervalMs": "60000"}}',
        /^auto rollout: steps has 0 percents/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [0, 100]}}',
        /^auto rollout: steps\[0\] is 0; each step is a percent above 0, at most 100$/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [10, 5, 100]}}',
        /^auto rollout: steps must increase: steps\[1\] is 5 after 10$/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [10, 50]}}',
        /^auto rollout: the last step is 50; it must be 100/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "intervalMs": "-1"}}',
        /^auto rollout: interval_ms is -1/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "maxErrorRateIncrease": 5}}',
        /^auto rollout: max_error_rate_increase is 5; it must be from 0 to 1$/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "maxP99Ratio": "NaN"}}',
        /^auto rollout: max_p99_ratio is NaN/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "minAgreement": 1.5}}',
        /^auto rollout: min_agreement is 1\.5/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "maxBurnRate": 2}}',
        /^auto rollout: objective is 0; max_burn_rate needs the availability objective it burns/,
      ],
      [
        'POST',
        '/admin/v1/models/mlp/rollout/auto',
        '{"version": "3", "analysis": {"steps": [100], "intervalMs": "1000", "minRequests": "10", "maxBurnRate": 2, "objective": 100}}',
        /^auto rollout: objective is 100/,
      ],
      ['POST', '/admin/v1/models/mlp/rollout/auto/resume', '{"version": "3"}', /takes no body/],
      ['POST', '/admin/v1/models/mlp/rollout/pause', '{"now": true}', /takes no body/],
      ['POST', '/admin/v1/models/bad%20name/rollout/pause', '', /invalid model name "bad name"/],
    ])(
      'answers %s %s %j with 400 naming the problem, never asking the registry',
      async (method, path, body, message) => {
        const reply = await http(port, method, path, {
          headers: { ...ADMIN, 'content-type': 'application/json' },
          body,
        });
        expect([reply.status, reply.json]).toEqual([400, { error: expect.stringMatching(message) }]);
        expect(state.seen).toEqual([]);
      },
    );

    it.each([
      [
        'FAILED_PRECONDITION',
        409,
        Errors.versionInUse('version "2" of model "mlp" still serves traffic; change the policies first'),
      ],
      ['ALREADY_EXISTS', 409, Errors.alreadyExists('version "2" of model "mlp" already exists')],
      ['NOT_FOUND', 404, Errors.modelNotFound('model "mlp" not found')],
      [
        'INVALID_ARGUMENT',
        400,
        Errors.invalidRequest('update_mask names "versions", which UpdateModel does not change'),
      ],
      ['PERMISSION_DENIED', 403, Errors.permissionDenied('not yours')],
      ['UNAVAILABLE', 503, Errors.upstreamUnavailable('the model store is unavailable; retry later')],
      ['DEADLINE_EXCEEDED', 504, Errors.deadlineExceeded('the request deadline passed')],
    ])("answers a registry %s with HTTP %i and the registry's message", async (_code, httpStatus, error) => {
      state.script['retireModelVersion'] = async () => {
        throw error;
      };
      const reply = await http(port, 'POST', '/admin/v1/models/mlp/versions/2/retire');
      expect([reply.status, reply.json]).toEqual([httpStatus, { error: error.message }]);
    });

    it("answers the registry's refusal of a variant by its accuracy gate with 409 and the registry's message", async () => {
      const refusal =
        'the int8 variant of models/mlp/versions/2 is off by relative L2 0.0712, above the gate 0.02; nothing was registered';
      state.script['quantizeModelVersion'] = async () => {
        throw Errors.accuracyGate(refusal);
      };
      const reply = await json(port, 'POST', '/admin/v1/models/mlp/versions/2/quantize', {});
      expect([reply.status, reply.json]).toEqual([409, { error: refusal }]);
    });

    it("answers the registry's refusal of an automatic rollout with 409 and the registry's message", async () => {
      const refusal =
        'version 3 of model "mlp" is LOADING, not READY: an automatic rollout starts from a READY version';
      state.script['startAutoRollout'] = async () => {
        throw Errors.versionNotReady(refusal);
      };
      const reply = await json(port, 'POST', '/admin/v1/models/mlp/rollout/auto', {
        version: '3',
        analysis: { steps: [50, 100], intervalMs: '1000', minRequests: '10' },
      });
      expect([reply.status, reply.json]).toEqual([409, { error: refusal }]);
    });

    it('answers a registry RESOURCE_EXHAUSTED with 429 and Retry-After', async () => {
      state.script['setRolloutPolicy'] = async () => {
        throw Errors.overloaded('too many policy changes', { retryDelayMs: 2000 });
      };
      const reply = await json(port, 'PUT', '/admin/v1/models/mlp/rollout', { stableVersion: '2' });
      expect([reply.status, reply.headers['retry-after'], reply.json]).toEqual([
        429,
        '2',
        { error: 'too many policy changes' },
      ]);
    });

    it('answers 405 with Allow to an admin path asked with the wrong method', async () => {
      const artifacts = await http(port, 'GET', '/admin/v1/artifacts');
      expect([artifacts.status, artifacts.headers['allow']]).toEqual([405, 'POST']);
      const model = await http(port, 'POST', '/admin/v1/models/mlp');
      expect([model.status, model.headers['allow']]).toEqual([405, 'GET, PATCH, DELETE, HEAD']);
      expect((await http(port, 'GET', '/v2/repository/models/mlp/load')).status).toBe(405);
      for (const path of [
        '/admin/v1/models/mlp/rollout/auto',
        '/admin/v1/models/mlp/rollout/auto/resume',
        '/admin/v1/models/mlp/rollout/pause',
      ]) {
        const reply = await http(port, 'GET', path);
        expect([reply.status, reply.headers['allow']]).toEqual([405, 'POST']);
      }
      expect(state.seen).toEqual([]);
    });

    describe('POST /admin/v1/artifacts', () => {
      it('streams the body into UploadArtifact as it arrives, past the JSON body limit, and answers the Artifact', async () => {
        const artifact = bytes(600_000, 3);
        const { req, reply } = send(port, 'POST', '/admin/v1/artifacts', {
          ...octets,
          'x-artifact-sha256': sha256Of(artifact),
        });
        req.write(artifact.subarray(0, 200_000));
        // The registry has bytes while the client still holds most of the artifact: nothing waits for the whole body.
        await eventually(() => (state.uploads[0]?.chunks.length ?? 0) > 0); // the registry got a first chunk
        expect(state.uploads[0]!.chunks.reduce((n, c) => n + c.length, 0)).toBeLessThanOrEqual(200_000);
        req.end(artifact.subarray(200_000));
        const { status: code, json: body } = await reply;

        expect([code, body]).toEqual([
          200,
          { sha256: sha256Of(artifact), sizeBytes: String(artifact.length), format: 'onnx' },
        ]);
        const [upload] = state.uploads;
        expect(Buffer.concat(upload!.chunks).equals(artifact)).toBe(true);
        expect(upload!.chunks.length).toBeGreaterThan(1);
        expect(upload!.expectedSha256).toEqual([sha256Of(artifact)]);
      });

      it("passes the registry's refusal of a wrong x-artifact-sha256 on as a 400", async () => {
        const reply = await http(port, 'POST', '/admin/v1/artifacts', {
          headers: { ...octets, 'x-artifact-sha256': '0'.repeat(64) },
          body: bytes(5000, 4),
        });
        expect([reply.status, reply.json]).toEqual([
          400,
          { error: expect.stringContaining(`not the expected_sha256 ${'0'.repeat(64)}`) },
        ]);
      });

      it("answers 413 with the registry's message to an artifact over the registry's limit", async () => {
        const reply = await http(port, 'POST', '/admin/v1/artifacts', {
          headers: octets,
          body: bytes(MAX_ARTIFACT_BYTES + 70_000, 5),
        });
        expect([reply.status, reply.json]).toEqual([
          413,
          { error: expect.stringContaining(`limit of ${MAX_ARTIFACT_BYTES} bytes`) },
        ]);
      });

      it('refuses an upload without a key at once, without reading its body, and closes the connection', async () => {
        const { req, reply } = send(port, 'POST', '/admin/v1/artifacts', {
          'content-type': 'application/octet-stream',
          'content-length': String(64 << 20),
        });
        req.write(bytes(1000, 7));
        const refused = await reply;
        req.destroy();
        expect([refused.status, refused.headers['connection']]).toEqual([401, 'close']);
        expect(state.uploads).toEqual([]);
      });

      it('answers 415 to a body that is not application/octet-stream', async () => {
        const reply = await http(port, 'POST', '/admin/v1/artifacts', {
          headers: { ...ADMIN, 'content-type': 'application/json' },
          body: '{}',
        });
        expect([reply.status, reply.json]).toEqual([
          415,
          { error: expect.stringContaining('application/octet-stream') },
        ]);
        expect(state.uploads).toEqual([]);
      });

      it('cancels the upload when the client goes away mid-way', async () => {
        state.holdUploads = true;
        const { req, reply } = send(port, 'POST', '/admin/v1/artifacts', octets);
        reply.catch(() => undefined);
        req.write(bytes(100_000, 6));
        await eventually(() => (state.uploads[0]?.chunks.length ?? 0) > 0); // the registry got a first chunk
        req.destroy();
        await eventually(() => state.uploads[0]!.signal.aborted); // the registry saw the cancellation
        expect(state.uploads[0]!.signal.aborted).toBe(true);
      });
    });
  });

  describe(RegistryAdminGrpcController.name, () => {
    it.each([
      ['no key', {}, status.UNAUTHENTICATED, 'UNAUTHENTICATED', /missing API key/],
      ['a wrong key', bearer('not-a-key-at-all-0123'), status.UNAUTHENTICATED, 'UNAUTHENTICATED', /invalid API key/],
      [
        'an infer-only key',
        bearer(INFER_KEY),
        status.PERMISSION_DENIED,
        'PERMISSION_DENIED',
        /^this API key lacks the admin scope$/,
      ],
    ])('refuses %s before the registry hears of it', async (_label, metadata, code, reason, message) => {
      const unary = await rpcRejection(admin.listModels({}, { metadata }));
      async function* oneChunk() {
        yield { chunk: bytes(10, 1) };
      }
      const upload = await rpcRejection(admin.uploadArtifact(oneChunk(), { metadata }));
      const watch = await rpcRejection(firstOf(admin.watchModels({}, { metadata })));
      for (const error of [unary, upload, watch])
        expect(error).toMatchObject({ code, reason, message: expect.stringMatching(message) });
      expect(state.seen).toEqual([]);
      expect(state.uploads).toEqual([]);
    });

    it('lets keys with the admin scope in, and keeps an admin-only key out of inference', async () => {
      expect(await admin.listModels({}, { metadata: bearer(ADMIN_KEY) })).toMatchObject({
        models: [{ name: 'models/mlp' }],
      });
      expect(await admin.listModels({}, { metadata: bearer(FULL_KEY) })).toMatchObject({
        models: [{ name: 'models/mlp' }],
      });
      const refused = await rpcRejection(inference.modelMetadata({ name: 'mlp' }, { metadata: bearer(ADMIN_KEY) }));
      expect(refused).toMatchObject({
        code: status.PERMISSION_DENIED,
        reason: 'PERMISSION_DENIED',
        message: 'this API key lacks the infer scope',
      });
    });

    const retired = { version: { ...VERSION, state: VersionState.RETIRED } };
    it.each<[string, (client: typeof admin, metadata: Record<string, string>) => Promise<unknown>, JsonValue, object]>([
      [
        'getModel',
        (c, metadata) => c.getModel({ name: 'models/mlp' }, { metadata }),
        { name: 'models/mlp' },
        { model: MODEL },
      ],
      ['listModels', (c, metadata) => c.listModels({}, { metadata }), {}, { models: [MODEL] }],
      [
        'resolveModelVersion',
        (c, metadata) => c.resolveModelVersion({ model: 'models/mlp', versionId: '2' }, { metadata }),
        { model: 'models/mlp', versionId: '2' },
        { version: VERSION },
      ],
      [
        'createModelVersion',
        (c, metadata) =>
          c.createModelVersion(
            { parent: 'models/mlp', versionId: '3', artifactSha256: 'ab'.repeat(32), maxBatchSize: 4 },
            { metadata },
          ),
        { parent: 'models/mlp', versionId: '3', artifactSha256: 'ab'.repeat(32), maxBatchSize: 4 },
        { version: VERSION },
      ],
      [
        'setRolloutPolicy',
        (c, metadata) =>
          c.setRolloutPolicy({ model: 'models/mlp', policy: { canary: { version: '3', percent: 5 } } }, { metadata }),
        { model: 'models/mlp', policy: { canary: { version: '3', percent: 5 } } },
        { model: MODEL },
      ],
      [
        'updateRollout',
        (c, metadata) =>
          c.updateRollout({ model: 'models/mlp', action: { case: 'rollback', value: true } }, { metadata }),
        { model: 'models/mlp', rollback: true },
        { model: MODEL },
      ],
      [
        'updateRollout',
        (c, metadata) => c.updateRollout({ model: 'models/mlp', action: { case: 'pause', value: true } }, { metadata }),
        { model: 'models/mlp', pause: true },
        { model: MODEL },
      ],
      [
        'startAutoRollout',
        (c, metadata) =>
          c.startAutoRollout(
            {
              model: 'models/mlp',
              version: '3',
              analysis: { steps: [10, 100], intervalMs: 30_000n, minRequests: 50n, maxP99Ratio: 1.5 },
            },
            { metadata },
          ),
        {
          model: 'models/mlp',
          version: '3',
          analysis: { steps: [10, 100], intervalMs: '30000', minRequests: '50', maxP99Ratio: 1.5 },
        },
        { model: MODEL },
      ],
      [
        'startAutoRollout',
        (c, metadata) => c.startAutoRollout({ model: 'models/mlp', resume: true }, { metadata }),
        { model: 'models/mlp', resume: true },
        { model: MODEL },
      ],
      [
        'setCachePolicy',
        (c, metadata) => c.setCachePolicy({ model: 'models/mlp', policy: { ttlMs: 1000n } }, { metadata }),
        { model: 'models/mlp', policy: { ttlMs: '1000' } },
        { model: MODEL },
      ],
      [
        'updateModel',
        (c, metadata) =>
          c.updateModel(
            { model: { name: 'models/mlp', pinned: true }, updateMask: { paths: ['pinned'] } },
            { metadata },
          ),
        { model: { name: 'models/mlp', pinned: true }, updateMask: 'pinned' },
        { model: MODEL },
      ],
      [
        'retireModelVersion',
        (c, metadata) => c.retireModelVersion({ name: 'models/mlp/versions/2' }, { metadata }),
        { name: 'models/mlp/versions/2' },
        retired,
      ],
      ['deleteModel', (c, metadata) => c.deleteModel({ name: 'models/mlp' }, { metadata }), { name: 'models/mlp' }, {}],
      [
        'quantizeModelVersion',
        (c, metadata) =>
          c.quantizeModelVersion(
            {
              source: 'models/mlp/versions/2',
              targetModel: 'models/mlp_int8',
              versionId: '4',
              calibration: [{ inputs: [{ name: 'x', shape: [1n, 2n], contents: { case: 'zeroData', value: true } }] }],
              maxRelativeL2: 0.05,
              settings: { perChannel: false },
            },
            { metadata },
          ),
        {
          source: 'models/mlp/versions/2',
          targetModel: 'models/mlp_int8',
          versionId: '4',
          calibration: [{ inputs: [{ name: 'x', shape: ['1', '2'], zeroData: true }] }],
          maxRelativeL2: 0.05,
          settings: { perChannel: false },
        },
        { version: DERIVED },
      ],
    ])(
      "forwards %s with the caller's request id and a deadline, and answers the registry's response",
      async (rpc, call, expected, answer) => {
        const response = await call(admin, { ...ADMIN, 'x-request-id': 'admin-grpc-1' });
        expect(state.seen).toEqual([
          { method: rpc, request: expected, requestId: 'admin-grpc-1', deadlineMs: expect.any(Number) },
        ]);
        // No deadline was given: the configured default (30 s) applies.
        expect(state.seen[0]!.deadlineMs! - clock.now()).toBeGreaterThanOrEqual(30_000);
        expect(response).toMatchObject(answer);
      },
    );

    it("keeps the caller's deadline", async () => {
      await admin.getModel({ name: 'models/mlp' }, { metadata: ADMIN, timeoutMs: 10_000 });
      // The caller's deadline, not the default (30 s).
      expect(state.seen[0]!.deadlineMs! - clock.now()).toBeGreaterThanOrEqual(10_000);
      expect(state.seen[0]!.deadlineMs! - clock.now()).toBeLessThan(30_000);
    });

    it('refuses ReportVersionState, which only workers send and only to the registry', async () => {
      const error = await rpcRejection(
        admin.reportVersionState(
          { name: 'models/mlp/versions/2', state: VersionState.READY },
          { metadata: bearer(FULL_KEY) },
        ),
      );
      expect(error).toMatchObject({
        code: status.PERMISSION_DENIED,
        reason: 'PERMISSION_DENIED',
        message: expect.stringContaining('reported by workers only'),
      });
      expect(state.seen).toEqual([]);
    });

    it.each([
      ['no key', {}],
      ['an admin key', ADMIN],
    ])(
      'answers ReportTraffic, which routers send straight to the registry, with UNIMPLEMENTED given %s, never forwarding it',
      async (_label, metadata) => {
        const error = await rpcRejection(
          admin.reportTraffic(
            { reporter: 'router-1', versions: [{ name: 'models/mlp/versions/2', counters: { requests: 5n } }] },
            { metadata },
          ),
        );
        expect(error).toMatchObject({
          code: status.UNIMPLEMENTED,
          message: expect.stringContaining('reported by routers only'),
        });
        expect(state.seen).toEqual([]);
      },
    );

    it('refuses StartAutoRollout to a key without the admin scope, as UpdateRollout', async () => {
      for (const call of [
        admin.startAutoRollout({ model: 'models/mlp', resume: true }, { metadata: bearer(INFER_KEY) }),
        admin.updateRollout(
          { model: 'models/mlp', action: { case: 'pause', value: true } },
          { metadata: bearer(INFER_KEY) },
        ),
      ]) {
        expect(await rpcRejection(call)).toMatchObject({
          code: status.PERMISSION_DENIED,
          message: 'this API key lacks the admin scope',
        });
      }
      expect(state.seen).toEqual([]);
    });

    it("passes the registry's errors on with their code, message and ErrorInfo", async () => {
      state.script['retireModelVersion'] = async () => {
        throw Errors.versionInUse('version "2" of model "mlp" still serves traffic', {
          metadata: { model: 'mlp', version: '2' },
        });
      };
      const error = await rpcRejection(
        admin.retireModelVersion({ name: 'models/mlp/versions/2' }, { metadata: ADMIN }),
      );
      expect(error).toMatchObject({
        code: status.FAILED_PRECONDITION,
        message: 'version "2" of model "mlp" still serves traffic',
        reason: 'VERSION_IN_USE',
        metadata: { model: 'mlp', version: '2' },
      });
      const streamed = await rpcRejection(firstOf(admin.downloadArtifact({ sha256: 'missing' }, { metadata: ADMIN })));
      expect(streamed).toMatchObject({
        code: status.NOT_FOUND,
        reason: 'ARTIFACT_NOT_FOUND',
        metadata: { sha256: 'missing' },
      });
    });

    it('forwards UploadArtifact chunk by chunk as the chunks come', async () => {
      const chunks = [bytes(70_000, 1), bytes(50_000, 2), bytes(3, 3)];
      const firstArrived = deferred();
      state.onChunk = () => firstArrived.resolve();
      async function* requests() {
        yield { chunk: chunks[0]!, expectedSha256: sha256Of(Buffer.concat(chunks)) };
        // The registry has the first chunk before the caller has sent the second.
        await firstArrived.promise;
        yield { chunk: chunks[1]! };
        yield { chunk: chunks[2]! };
      }
      const response = await admin.uploadArtifact(requests(), { metadata: ADMIN });
      expect(response.artifact).toEqual(
        create(ArtifactSchema, { sha256: sha256Of(Buffer.concat(chunks)), sizeBytes: 120_003n, format: 'onnx' }),
      );
      expect(state.uploads[0]!.chunks).toEqual(chunks);
      expect(state.uploads[0]!.expectedSha256).toEqual([sha256Of(Buffer.concat(chunks))]);
    });

    it('forwards DownloadArtifact message by message as the registry sends them', async () => {
      state.downloadGates = [deferred(), deferred()];
      const received: Buffer[] = [];
      for await (const message of admin.downloadArtifact({ sha256: 'ab'.repeat(32) }, { metadata: ADMIN })) {
        received.push(Buffer.from(message.chunk));
        // The registry sends the next chunk only once this one has reached the caller.
        state.downloadGates[received.length - 1]?.resolve();
      }
      expect(received).toEqual([Buffer.alloc(1000, 1), Buffer.alloc(1000, 2), Buffer.alloc(1000, 3)]);
      expect(state.seen).toEqual([
        {
          method: 'downloadArtifact',
          request: { sha256: 'ab'.repeat(32) },
          requestId: expect.any(String),
          deadlineMs: undefined,
        },
      ]);
    });

    it("follows WatchModels without a deadline, and cancels the registry's stream when the caller cancels", async () => {
      const messages = [];
      for await (const message of admin.watchModels({ fromRevision: 3n }, { metadata: ADMIN })) {
        messages.push(message);
        break;
      }
      expect(messages).toMatchObject([{ revision: 7n, snapshot: true, models: [{ name: 'models/mlp' }] }]);
      expect(state.seen).toEqual([
        { method: 'watchModels', request: { fromRevision: '3' }, requestId: expect.any(String), deadlineMs: undefined },
      ]);
      await state.watchCancelled.promise;
    });
  });
});

describe('gateway admin API with the registry down', () => {
  it("answers 503 over REST and UNAVAILABLE over gRPC without naming the registry's address", async () => {
    const [grpc, metrics, httpPort, router, registry] = await freePortList(5);
    const gateway = await startGateway(
      loadGatewayConfig({
        GATEWAY_API_KEYS: ADMIN_KEY,
        GATEWAY_ROUTER_ADDRESS: `127.0.0.1:${router}`,
        // Nor there.
        GATEWAY_REGISTRY_ADDRESS: `127.0.0.1:${registry}`,
        GATEWAY_GRPC_PORT: String(grpc),
        GATEWAY_METRICS_PORT: String(metrics),
        GATEWAY_HTTP_PORT: String(httpPort),
        GATEWAY_LOG_LEVEL: 'error',
        GATEWAY_SHUTDOWN_GRACE_MS: '200',
      }),
    );
    const client = createClient(RegistryService, `127.0.0.1:${gateway.grpcPort}`);
    try {
      const rest = await http(gateway.httpPort!, 'GET', '/admin/v1/models');
      expect([rest.status, rest.json]).toEqual([503, { error: expect.stringContaining('registry') }]);
      expect(rest.text).not.toContain('127.0.0.1');
      const error = await rpcRejection(client.listModels({}, { metadata: ADMIN }));
      expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'UPSTREAM_UNAVAILABLE']);
    } finally {
      client.close();
      await gateway.stop();
    }
  });
});
