import { status } from '@grpc/grpc-js';
import type { Clock } from '@infermesh/clock';
import { createClient, type ServiceClient } from '@infermesh/grpc';
import {
  buildClassifierModel,
  buildMultiIoModel,
  buildPaddedModel,
  buildSampleRateModel,
  buildTinyModel,
  CLASSIFIER_PROCESSING,
  encodeModel,
  floatInitializer,
  node,
} from '@infermesh/model-builder';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Artifact,
  BatchingSchema,
  CachePolicySchema,
  ExecutionSchema,
  RolloutPolicySchema,
  ProcessingSchema,
  RegistryService,
  type UploadArtifactRequestSchema,
  VersionState,
  type WatchModelsResponse,
  WatchModelsResponseSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { bind, bootstrap, type RunningService } from '@infermesh/runtime';
import { eventually, ManualClock, type RedisServer, rpcRejection, startRedisServer } from '@infermesh/testing';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { ModelWatch } from './model-watch';
import { loadRegistryConfig } from './registry.config';
import { RegistryGrpcController } from './registry.grpc';
import { RegistryModule } from './registry.module';

type Client = ServiceClient<typeof RegistryService>;
type UploadMessage = MessageInitShape<typeof UploadArtifactRequestSchema>;

const MAX_ARTIFACT_BYTES = 256 * 1024;
const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

async function* messages(list: UploadMessage[]): AsyncGenerator<UploadMessage> {
  yield* list;
}

/** The bytes in chunks of chunkBytes; the expected SHA-256, when given, rides on the last message. */
function upload(
  client: Client,
  bytes: Uint8Array,
  chunkBytes = 100,
  expectedSha256?: string,
): Promise<{ artifact?: Artifact }> {
  const list: UploadMessage[] = [];
  for (let offset = 0; offset < bytes.length; offset += chunkBytes)
    list.push({ chunk: bytes.subarray(offset, offset + chunkBytes) });
  if (expectedSha256 !== undefined) list.push({ expectedSha256 });
  return client.uploadArtifact(messages(list));
}

async function download(client: Client, sha: string): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  for await (const response of client.downloadArtifact({ sha256: sha })) chunks.push(response.chunk);
  return Buffer.concat(chunks);
}

function fixedBatchModel(): Uint8Array {
  return encodeModel('fixed', {
    nodes: [node('Add', ['input', 'bias'], ['output'], 'add')],
    initializers: [floatInitializer('bias', [4], Float32Array.of(1, 2, 3, 4))],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4] }],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [1, 4] }],
  }).bytes;
}

let redisServer: RedisServer;
beforeAll(async () => {
  redisServer = await startRedisServer();
});
afterAll(async () => {
  await redisServer.stop();
});

describe.each(['embedded', 'redis'] as const)(`${RegistryGrpcController.name} end to end (%s store)`, (backend) => {
  let dataDir: string;
  let running: RunningService;
  let sut: Client;

  async function start(env: Record<string, string> = {}, clock?: Clock): Promise<void> {
    const config = loadRegistryConfig({
      REGISTRY_GRPC_PORT: '0',
      REGISTRY_METRICS_PORT: '0',
      REGISTRY_LOG_LEVEL: 'error',
      REGISTRY_DATA_DIR: dataDir,
      REGISTRY_MAX_ARTIFACT_BYTES: String(MAX_ARTIFACT_BYTES),
      ...(backend === 'redis' && { REDIS_URL: redisServer.url }),
      ...env,
    });
    // Each test gets its own keyspace on the shared redis-server.
    config.redisKeyPrefix = `test:${basename(dataDir)}:`;
    running = await bootstrap({
      module: RegistryModule.forRoot(config, { clock }),
      grpc: (app) => [bind(RegistryService, app.get(RegistryGrpcController))],
      beforeShutdown: (app) => void app.get(ModelWatch).close(),
    });
    sut = createClient(RegistryService, `127.0.0.1:${running.grpcPort}`);
  }

  async function stop(): Promise<void> {
    sut.close();
    await running.stop();
  }

  beforeEach(async () => {
    dataDir = mkdtempSync(join(tmpdir(), 'infermesh-registry-e2e-'));
    await start();
  });
  afterEach(async () => {
    await stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  async function register(model: string, versionId: string, bytes: Uint8Array, maxBatchSize?: number) {
    const { artifact } = await upload(sut, bytes);
    const request = {
      parent: `models/${model}`,
      versionId,
      artifactSha256: artifact!.sha256,
      ...(maxBatchSize !== undefined && { maxBatchSize }),
    };
    return (await sut.createModelVersion(request)).version!;
  }

  const ready = (model: string, versionId: string) =>
    sut.reportVersionState({
      name: `models/${model}/versions/${versionId}`,
      state: VersionState.READY,
      workerId: 'worker-1',
    });

  it('uploads in chunks, registers a version, serves it once READY, and downloads identical bytes', async () => {
    const tiny = buildTinyModel().bytes;
    const { artifact } = await upload(sut, tiny, 100, sha256(tiny));
    expect(artifact).toMatchObject({ sha256: sha256(tiny), sizeBytes: BigInt(tiny.length), format: 'onnx' });

    const { version } = await sut.createModelVersion({
      parent: 'models/tiny',
      versionId: '1',
      artifactSha256: artifact!.sha256,
    });
    expect(version).toMatchObject({
      name: 'models/tiny/versions/1',
      state: VersionState.REGISTERED,
      artifact: { sha256: sha256(tiny) },
    });
    expect(
      version!.signature!.inputs.map((s) => ({ name: s.name, datatype: s.datatype, shape: s.shape.map(Number) })),
    ).toEqual([{ name: 'input', datatype: DataType.FP32, shape: [-1, 4] }]);
    expect(version!.signature!.outputs[0]!.shape.map(Number)).toEqual([-1, 3]);
    expect(version!.signature!.maxBatchSize).toBe(64);
    expect(version!.createTime).toBeDefined();

    for (const versionId of ['', '1']) {
      const notReady = await rpcRejection(sut.resolveModelVersion({ model: 'models/tiny', versionId }));
      expect([notReady.code, notReady.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
    }
    await sut.reportVersionState({ name: 'models/tiny/versions/1', state: VersionState.LOADING, workerId: 'worker-1' });
    expect((await rpcRejection(sut.resolveModelVersion({ model: 'models/tiny' }))).message).toMatch(
      /version 1|no READY version/,
    );

    const reported = await ready('tiny', '1');
    expect(reported.version!.state).toBe(VersionState.READY);
    const resolved = await sut.resolveModelVersion({ model: 'models/tiny' });
    expect(resolved.version!.name).toBe('models/tiny/versions/1');
    expect(resolved.version!.signature!.maxBatchSize).toBe(64);
    expect((await sut.resolveModelVersion({ model: 'models/tiny', versionId: '1' })).version!.state).toBe(
      VersionState.READY,
    );

    expect(Buffer.compare(await download(sut, artifact!.sha256), Buffer.from(tiny))).toBe(0);
  });

  it('downloads a large artifact in chunks of at most 1 MiB', async () => {
    await stop();
    await start({ REGISTRY_MAX_ARTIFACT_BYTES: String(8 * 1024 * 1024) });
    const big = buildPaddedModel(2 * 1024 * 1024 + 4096).bytes;
    const { artifact } = await upload(sut, big, 256 * 1024);
    const sizes: number[] = [];
    const chunks: Uint8Array[] = [];
    for await (const response of sut.downloadArtifact({ sha256: artifact!.sha256 })) {
      sizes.push(response.chunk.byteLength);
      chunks.push(response.chunk);
    }
    expect(big.length).toBeGreaterThan(2 * 1024 * 1024);
    expect(big.length).toBeLessThan(3 * 1024 * 1024);
    expect(sizes).toEqual([1024 * 1024, 1024 * 1024, big.length - 2 * 1024 * 1024]);
    expect(Buffer.concat(chunks).equals(big)).toBe(true);
  });

  it('registers the same version with the same artifact idempotently, and refuses a different artifact', async () => {
    const first = await register('tiny', '1', buildTinyModel().bytes);
    const again = await register('tiny', '1', buildTinyModel().bytes);
    expect(again).toEqual(first);

    const conflict = await rpcRejection(register('tiny', '1', buildMultiIoModel().bytes));
    expect([conflict.code, conflict.reason]).toEqual([status.ALREADY_EXISTS, 'ALREADY_EXISTS']);
    expect((await sut.getModel({ name: 'models/tiny' })).model!.versions).toHaveLength(1);
  });

  it('refuses an artifact that is not an ONNX model and registers nothing', async () => {
    const error = await rpcRejection(register('broken', '1', Buffer.from('garbage bytes, not a model')));
    expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_ARTIFACT']);
    expect(error.message).toMatch(/not a valid ONNX model/);
    const missing = await rpcRejection(sut.getModel({ name: 'models/broken' }));
    expect([missing.code, missing.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
    expect((await sut.listModels({})).models).toEqual([]);
  });

  it('refuses a version whose artifact was never uploaded', async () => {
    const error = await rpcRejection(
      sut.createModelVersion({ parent: 'models/tiny', versionId: '1', artifactSha256: sha256(Buffer.from('nope')) }),
    );
    expect([error.code, error.reason]).toEqual([status.NOT_FOUND, 'ARTIFACT_NOT_FOUND']);
  });

  it('gives a model with a fixed first dimension max batch size 0, and lets the request override the default', async () => {
    expect((await register('fixed', '1', fixedBatchModel())).signature!.maxBatchSize).toBe(0);
    expect((await register('tiny', '1', buildTinyModel().bytes, 8)).signature!.maxBatchSize).toBe(8);
    const error = await rpcRejection(register('fixed', '2', fixedBatchModel(), 8));
    expect(error.code).toBe(status.INVALID_ARGUMENT);
  });

  it('registers a version with its processing, returns it everywhere, and keeps it across a restart', async () => {
    const classifier = buildClassifierModel();
    const { artifact } = await upload(sut, classifier.bytes);
    const request = {
      parent: 'models/classifier',
      versionId: '1',
      artifactSha256: artifact!.sha256,
      processing: CLASSIFIER_PROCESSING,
    };
    const expected = create(ProcessingSchema, CLASSIFIER_PROCESSING);
    expect((await sut.createModelVersion(request)).version!.processing).toEqual(expected);
    expect((await sut.createModelVersion(request)).version!.processing).toEqual(expected);
    await ready('classifier', '1');
    await stop();
    await start();
    expect((await sut.resolveModelVersion({ model: 'models/classifier' })).version!.processing).toEqual(expected);
    expect((await sut.getModel({ name: 'models/classifier' })).model!.versions[0]!.processing).toEqual(expected);
    expect((await sut.listModels({})).models[0]!.versions[0]!.processing).toEqual(expected);
    // A version without processing has none.
    expect((await register('tiny', '1', buildTinyModel().bytes)).processing).toBeUndefined();
  });

  it('refuses processing that does not fit the signature, naming the problem, and registers nothing', async () => {
    const { artifact } = await upload(sut, buildClassifierModel().bytes);
    const attempt = (processing: MessageInitShape<typeof ProcessingSchema>) =>
      rpcRejection(
        sut.createModelVersion({
          parent: 'models/classifier',
          versionId: '1',
          artifactSha256: artifact!.sha256,
          processing,
        }),
      );
    const cases: [MessageInitShape<typeof ProcessingSchema>, string][] = [
      [{ inputNormalizations: [{ input: 'image', mean: [1] }] }, 'no input "image"'],
      [{ inputNormalizations: [{ input: 'input', std: [1, 0, 1, 1] }] }, 'std[1] is 0'],
      [
        { inputNormalizations: [{ input: 'input', mean: [1, 2, 3] }] },
        'mean has 3 values but the last dimension of [-1,4] is 4',
      ],
      [{ outputLabels: [{ output: 'probs', labels: ['a'] }] }, 'no output "probs"'],
      [{ outputLabels: [{ output: 'scores', labels: ['a', 'b'] }] }, 'has 5 classes per item but 2 labels'],
    ];
    for (const [processing, message] of cases) {
      const error = await attempt(processing);
      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(error.message).toContain(message);
    }
    const missing = await rpcRejection(sut.getModel({ name: 'models/classifier' }));
    expect(missing.code).toBe(status.NOT_FOUND);
  });

  it('refuses to register an existing version again with a different processing', async () => {
    const { artifact } = await upload(sut, buildClassifierModel().bytes);
    const base = { parent: 'models/classifier', versionId: '1', artifactSha256: artifact!.sha256 };
    await sut.createModelVersion({ ...base, processing: CLASSIFIER_PROCESSING });
    for (const processing of [undefined, { outputLabels: [{ output: 'scores', labels: ['a', 'b', 'c', 'd', 'e'] }] }]) {
      const conflict = await rpcRejection(
        sut.createModelVersion({ ...base, ...(processing !== undefined && { processing }) }),
      );
      expect([conflict.code, conflict.reason]).toEqual([status.ALREADY_EXISTS, 'ALREADY_EXISTS']);
      expect(conflict.message).toMatch(/different processing/);
    }
  });

  const BATCHING: MessageInitShape<typeof BatchingSchema> = {
    maxBatchSize: 16,
    maxQueueDelayUs: 2_000n,
    preferredBatchSizes: [4, 16],
    preserveOrdering: true,
    priorityLevels: 2,
    defaultPriorityLevel: 1,
    maxQueueSize: 100,
  };

  it('registers a version with its batching, returns it everywhere, and keeps it across a restart', async () => {
    const { artifact } = await upload(sut, buildTinyModel().bytes);
    const request = { parent: 'models/tiny', versionId: '1', artifactSha256: artifact!.sha256, batching: BATCHING };
    const expected = create(BatchingSchema, BATCHING);
    expect((await sut.createModelVersion(request)).version!.batching).toEqual(expected);
    expect((await sut.createModelVersion(request)).version!.batching).toEqual(expected);
    await ready('tiny', '1');
    expect((await sut.resolveModelVersion({ model: 'models/tiny', versionId: '1' })).version!.batching).toEqual(
      expected,
    );
    expect((await sut.getModel({ name: 'models/tiny' })).model!.versions[0]!.batching).toEqual(expected);
    await stop();
    await start();
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.batching).toEqual(expected);
    expect((await sut.getModel({ name: 'models/tiny' })).model!.versions[0]!.batching).toEqual(expected);
    // A version without batching, or with every field at its default, has none; an explicit 0 is kept.
    expect((await register('tiny', '2', buildTinyModel().bytes)).batching).toBeUndefined();
    expect(
      (await sut.createModelVersion({ ...request, versionId: '3', batching: {} })).version!.batching,
    ).toBeUndefined();
    const fixed = (await upload(sut, fixedBatchModel())).artifact!.sha256;
    const off = await sut.createModelVersion({
      parent: 'models/fixed',
      versionId: '1',
      artifactSha256: fixed,
      batching: { maxBatchSize: 0 },
    });
    expect(off.version!.batching?.maxBatchSize).toBe(0);
    expect((await sut.getModel({ name: 'models/fixed' })).model!.versions[0]!.batching?.maxBatchSize).toBe(0);
  });

  it('refuses batching that does not fit the signature, naming the problem, and registers nothing', async () => {
    const tiny = (await upload(sut, buildTinyModel().bytes)).artifact!.sha256;
    const fixed = (await upload(sut, fixedBatchModel())).artifact!.sha256;
    const cases: [string, MessageInitShape<typeof BatchingSchema>, string, number?][] = [
      [tiny, { maxBatchSize: 65 }, "batching: max_batch_size is 65, above the signature's max_batch_size 64"],
      [tiny, { maxBatchSize: 16 }, "batching: max_batch_size is 16, above the signature's max_batch_size 8", 8],
      [
        fixed,
        { maxBatchSize: 4 },
        "batching: max_batch_size is 4 but the model does not batch (its signature's max_batch_size is 0)",
      ],
      [fixed, { preferredBatchSizes: [1] }, 'batching: preferred_batch_sizes are given but batching is off'],
      [
        tiny,
        { maxQueueDelayUs: 10_000_001n },
        'batching: max_queue_delay_us is 10000001, above the limit of 10000000 (10 s)',
      ],
      [
        tiny,
        { maxBatchSize: 8, preferredBatchSizes: [16] },
        'batching: preferred batch size 16 is above the max batch size 8',
      ],
      [tiny, { preferredBatchSizes: [4, 4] }, 'batching: preferred batch size 4 is given more than once'],
      [tiny, { priorityLevels: 17 }, 'batching: priority_levels is 17, above the limit of 16'],
      [
        tiny,
        { priorityLevels: 2, defaultPriorityLevel: 3 },
        'batching: default_priority_level is 3, above the 2 priority levels',
      ],
    ];
    for (const [artifactSha256, batching, message, maxBatchSize] of cases) {
      const error = await rpcRejection(
        sut.createModelVersion({
          parent: 'models/batched',
          versionId: '1',
          artifactSha256,
          batching,
          ...(maxBatchSize !== undefined && { maxBatchSize }),
        }),
      );
      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(error.message).toContain(message);
    }
    const missing = await rpcRejection(sut.getModel({ name: 'models/batched' }));
    expect(missing.code).toBe(status.NOT_FOUND);
  });

  it('registers a version with the operator threads it asks for, refusing more than 256 and another number for an existing version', async () => {
    const { artifact } = await upload(sut, buildTinyModel().bytes);
    const base = { parent: 'models/tiny', versionId: '1', artifactSha256: artifact!.sha256 };
    const refused = await rpcRejection(sut.createModelVersion({ ...base, execution: { intraOpThreads: 300 } }));
    expect([refused.code, refused.message]).toEqual([
      status.INVALID_ARGUMENT,
      "execution: intra_op_threads is 300; it can be at most 256 (0: the worker's default)",
    ]);
    const { version } = await sut.createModelVersion({ ...base, execution: { intraOpThreads: 1 } });
    expect(version!.execution).toEqual(create(ExecutionSchema, { intraOpThreads: 1 }));
    // The same again is the same version; another number, or none, is another version.
    await sut.createModelVersion({ ...base, execution: { intraOpThreads: 1 } });
    for (const execution of [undefined, { intraOpThreads: 2 }]) {
      const conflict = await rpcRejection(
        sut.createModelVersion({ ...base, ...(execution !== undefined && { execution }) }),
      );
      expect([conflict.code, conflict.message]).toEqual([
        status.ALREADY_EXISTS,
        'models/tiny/versions/1 already exists with a different execution; register the new execution as a new version',
      ]);
    }
    // Asking for nothing (0) stores nothing.
    const { version: plain } = await sut.createModelVersion({
      ...base,
      versionId: '2',
      execution: { intraOpThreads: 0 },
    });
    expect(plain!.execution).toBeUndefined();
  });

  it('refuses to register an existing version again with a different batching', async () => {
    const { artifact } = await upload(sut, buildTinyModel().bytes);
    const base = { parent: 'models/tiny', versionId: '1', artifactSha256: artifact!.sha256 };
    await sut.createModelVersion({ ...base, batching: BATCHING });
    for (const batching of [
      undefined,
      { ...BATCHING, maxQueueDelayUs: 3_000n },
      { ...BATCHING, preferredBatchSizes: [4] },
    ]) {
      const conflict = await rpcRejection(
        sut.createModelVersion({ ...base, ...(batching !== undefined && { batching }) }),
      );
      expect([conflict.code, conflict.reason]).toEqual([status.ALREADY_EXISTS, 'ALREADY_EXISTS']);
      expect(conflict.message).toBe(
        'models/tiny/versions/1 already exists with a different batching; register the new batching as a new version',
      );
    }
    expect((await sut.getModel({ name: 'models/tiny' })).model!.versions[0]!.batching).toEqual(
      create(BatchingSchema, BATCHING),
    );
  });

  it('registers a version with its warm-up checked against the signature, keeps it across a restart, and refuses another warm-up for it', async () => {
    const { artifact } = await upload(sut, buildSampleRateModel().bytes);
    const audio = {
      name: 'audio',
      shape: [1n, 3n],
      contents: { case: 'data' as const, value: new Uint8Array(Float32Array.of(0.1, 0.2, 0.3).buffer) },
    };
    const rate = (sr: bigint) => ({
      name: 'sr',
      shape: [1n],
      contents: { case: 'data' as const, value: new Uint8Array(BigInt64Array.of(sr).buffer) },
    });
    const warmUp = { samples: [{ name: '16 kHz', inputs: [audio, rate(16000n)] }] };
    const base = { parent: 'models/vad', versionId: '1', artifactSha256: artifact!.sha256 };

    const refused = await rpcRejection(
      sut.createModelVersion({
        ...base,
        warmUp: { samples: [{ inputs: [{ ...audio, shape: [1n, -1n] }, rate(16000n)] }] },
      }),
    );
    expect(refused.code).toBe(status.INVALID_ARGUMENT);
    expect(refused.message).toBe(
      'warm_up: samples[0] input "audio" has shape [1,-1] but the model expects [-1,-1]; give a concrete size (0 or more) for each -1',
    );
    expect((await rpcRejection(sut.getModel({ name: 'models/vad' }))).code).toBe(status.NOT_FOUND);

    const { version } = await sut.createModelVersion({ ...base, warmUp });
    expect(version!.warmUp!.samples[0]!.inputs.map((i) => [i.name, i.datatype])).toEqual([
      ['audio', DataType.FP32],
      ['sr', DataType.INT64],
    ]);
    await stop();
    await start();
    const stored = (await sut.getModel({ name: 'models/vad' })).model!.versions[0]!;
    expect(stored.warmUp).toEqual(version!.warmUp);
    expect((await sut.createModelVersion({ ...base, warmUp })).version!.name).toBe('models/vad/versions/1');
    for (const other of [undefined, { samples: [{ name: '16 kHz', inputs: [audio, rate(8000n)] }] }]) {
      const conflict = await rpcRejection(
        sut.createModelVersion({ ...base, ...(other !== undefined && { warmUp: other }) }),
      );
      expect([conflict.code, conflict.message]).toEqual([
        status.ALREADY_EXISTS,
        'models/vad/versions/1 already exists with a different warm_up; register the new warm-up as a new version',
      ]);
    }
  });

  it('records that a READY version serves without warm-up, and why, until a READY report says it was warmed up', async () => {
    await register('vad', '1', buildSampleRateModel().bytes);
    const name = 'models/vad/versions/1';
    const why = 'synthetic warm-up at batch 1 failed on cpu: indices element out of data bounds';
    const cold = await sut.reportVersionState({
      name,
      state: VersionState.READY,
      workerId: 'worker-1',
      warmUpError: why,
    });
    expect([cold.version!.state, cold.version!.warmUpError]).toEqual([VersionState.READY, why]);
    expect((await sut.getModel({ name: 'models/vad' })).model!.versions[0]!.warmUpError).toBe(why);
    // Only READY reports carry it; the latest one says.
    await sut.reportVersionState({ name, state: VersionState.READY, workerId: 'worker-2' });
    expect((await sut.getModel({ name: 'models/vad' })).model!.versions[0]!.warmUpError).toBe('');
    const long = await sut.reportVersionState({
      name,
      state: VersionState.READY,
      workerId: 'worker-1',
      warmUpError: 'x'.repeat(10_000),
    });
    expect(long.version!.warmUpError).toHaveLength(2_000);
  });

  it('sets a rollout policy in one operation, keeps it across a restart, resolves the stable version by it, and clears it', async () => {
    for (const id of ['1', '2', '3', '4']) {
      await register('tiny', id, buildTinyModel().bytes);
      await ready('tiny', id);
    }
    await register('small', '1', buildTinyModel().bytes);
    const policy = {
      stableVersion: '2',
      canary: { version: '3', percent: 10 },
      variants: [{ version: '1', percent: 25 }],
      shadow: { version: '4', percent: 5 },
      fallbackModel: 'small',
    };

    const { model } = await sut.setRolloutPolicy({ model: 'models/tiny', policy });

    expect(model!.rollout).toEqual(create(RolloutPolicySchema, policy));
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/2');
    await stop();
    await start();
    expect((await sut.getModel({ name: 'models/tiny' })).model!.rollout).toEqual(create(RolloutPolicySchema, policy));
    await sut.setRolloutPolicy({ model: 'models/tiny' });
    expect((await sut.getModel({ name: 'models/tiny' })).model!.rollout).toBeUndefined();
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/4');
  });

  it('refuses a rollout policy that does not fit the model, naming the problem, and keeps the one it had', async () => {
    for (const id of ['1', '2']) await register('tiny', id, buildTinyModel().bytes);
    await sut.reportVersionState({
      name: 'models/tiny/versions/2',
      state: VersionState.FAILED,
      stateReason: 'bad',
      workerId: 'w',
    });
    const kept = { stableVersion: '1' };
    await sut.setRolloutPolicy({ model: 'models/tiny', policy: kept });
    const cases: [MessageInitShape<typeof RolloutPolicySchema>, string][] = [
      [
        { stableVersion: '7' },
        'rollout: the stable version is version "7", which model "tiny" does not have; its versions are 1, 2',
      ],
      [
        { canary: { version: '2', percent: 5 } },
        'rollout: the canary is version 2, which is FAILED and will never serve',
      ],
      [
        { stableVersion: '1', canary: { version: '1', percent: 5 } },
        'rollout: version 1 is named more than once (as the canary too)',
      ],
      [{ canary: { version: '1', percent: 101 } }, "rollout: the canary's percent is 101; it must be from 0 to 100"],
      [
        { canary: { version: '1', percent: Number.NaN } },
        "rollout: the canary's percent is NaN; it must be from 0 to 100",
      ],
    ];
    for (const [policy, message] of cases) {
      const error = await rpcRejection(sut.setRolloutPolicy({ model: 'models/tiny', policy }));
      expect([error.code, error.message]).toEqual([status.INVALID_ARGUMENT, message]);
    }
    await register('tiny', '3', buildTinyModel().bytes);
    const over = await rpcRejection(
      sut.setRolloutPolicy({
        model: 'models/tiny',
        policy: { canary: { version: '3', percent: 60 }, variants: [{ version: '1', percent: 50 }] },
      }),
    );
    expect(over.message).toBe("rollout: the canary's and the variants' percents add up to 110, more than 100");
    expect((await rpcRejection(sut.setRolloutPolicy({ model: 'models/none', policy: kept }))).code).toBe(
      status.NOT_FOUND,
    );
    const self = await rpcRejection(sut.setRolloutPolicy({ model: 'models/tiny', policy: { fallbackModel: 'tiny' } }));
    expect(self.message).toBe('rollout: model "tiny" cannot be its own fallback');
    const unknown = await rpcRejection(
      sut.setRolloutPolicy({ model: 'models/tiny', policy: { fallbackModel: 'small' } }),
    );
    expect([unknown.code, unknown.message]).toEqual([
      status.INVALID_ARGUMENT,
      'rollout: the fallback model "small" does not exist',
    ]);
    expect((await sut.getModel({ name: 'models/tiny' })).model!.rollout).toEqual(create(RolloutPolicySchema, kept));
  });

  it('promotes, sets weights and rolls back in one operation each', async () => {
    for (const id of ['1', '2', '3', '4']) {
      await register('tiny', id, buildTinyModel().bytes);
      await ready('tiny', id);
    }
    const rollout = async (action: Parameters<Client['updateRollout']>[0]['action']) =>
      (await sut.updateRollout({ model: 'models/tiny', action })).model!.rollout;
    await sut.setRolloutPolicy({
      model: 'models/tiny',
      policy: {
        stableVersion: '1',
        canary: { version: '2', percent: 10 },
        variants: [{ version: '3', percent: 20 }],
        shadow: { version: '4', percent: 5 },
      },
    });

    const weighted = await rollout({ case: 'setWeights', value: { percents: { '2': 50 } } });
    expect([weighted!.canary!.percent, weighted!.variants[0]!.percent, weighted!.stableVersion]).toEqual([50, 20, '1']);
    const tooMuch = await rpcRejection(
      sut.updateRollout({ model: 'models/tiny', action: { case: 'setWeights', value: { percents: { '3': 60 } } } }),
    );
    expect(tooMuch.message).toBe("rollout: the canary's and the variants' percents add up to 110, more than 100");
    const stranger = await rpcRejection(
      sut.updateRollout({ model: 'models/tiny', action: { case: 'setWeights', value: { percents: { '4': 1 } } } }),
    );
    expect(stranger.message).toBe(
      'rollout: version 4 is neither the canary nor a variant of model "tiny"; it has 2, 3',
    );

    const promoted = await rollout({ case: 'promote', value: '' });
    expect(promoted).toEqual(create(RolloutPolicySchema, { stableVersion: '2', shadow: { version: '4', percent: 5 } }));
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/2');
    const nothing = await rpcRejection(
      sut.updateRollout({ model: 'models/tiny', action: { case: 'promote', value: '' } }),
    );
    expect([nothing.code, nothing.message]).toEqual([
      status.FAILED_PRECONDITION,
      'rollout: model "tiny" has no canary to promote',
    ]);

    // A canary on a model without a pinned stable version: rolling back pins the latest version outside the trial.
    await sut.setRolloutPolicy({ model: 'models/tiny', policy: { canary: { version: '4', percent: 30 } } });
    expect(await rollout({ case: 'rollback', value: true })).toEqual(
      create(RolloutPolicySchema, { stableVersion: '3' }),
    );
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/3');
    expect(
      (await rpcRejection(sut.updateRollout({ model: 'models/tiny', action: { case: 'rollback', value: true } }))).code,
    ).toBe(status.FAILED_PRECONDITION);
  });

  it('sets a model cache policy, keeps it across a restart, refuses one out of its limits, and clears it', async () => {
    await register('tiny', '1', buildTinyModel().bytes);
    const policy = { enabled: true, ttlMs: 60_000n, maxEntryBytes: 1_024n };

    expect((await sut.setCachePolicy({ model: 'models/tiny', policy })).model!.cache).toEqual(
      create(CachePolicySchema, policy),
    );
    await stop();
    await start();
    expect((await sut.getModel({ name: 'models/tiny' })).model!.cache).toEqual(create(CachePolicySchema, policy));
    const long = await rpcRejection(sut.setCachePolicy({ model: 'models/tiny', policy: { ttlMs: 604_800_001n } }));
    expect([long.code, long.message]).toEqual([
      status.INVALID_ARGUMENT,
      "cache: ttl_ms is 604800001; it must be from 0 (the router's default) to 604800000 (7 days)",
    ]);
    const negative = await rpcRejection(sut.setCachePolicy({ model: 'models/tiny', policy: { maxEntryBytes: -1n } }));
    expect(negative.message).toBe('cache: max_entry_bytes is -1; it cannot be negative');
    expect((await sut.setCachePolicy({ model: 'models/tiny', policy: { enabled: false } })).model!.cache?.enabled).toBe(
      false,
    );
    expect((await sut.setCachePolicy({ model: 'models/tiny' })).model!.cache).toBeUndefined();
  });

  it('refuses an upload over the size limit, naming the limit, and stores nothing', async () => {
    const error = await rpcRejection(upload(sut, randomBytes(MAX_ARTIFACT_BYTES + 1), 64 * 1024));
    expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_ARTIFACT']);
    expect(error.message).toContain(`${MAX_ARTIFACT_BYTES} bytes (REGISTRY_MAX_ARTIFACT_BYTES)`);
    expect(readdirSync(join(dataDir, 'artifacts')).filter((f) => f !== '.incoming')).toEqual([]);
    expect(readdirSync(join(dataDir, 'artifacts', '.incoming'))).toEqual([]);
  });

  it('refuses an upload whose bytes do not match expected_sha256, and stores nothing', async () => {
    const bytes = randomBytes(5000);
    const error = await rpcRejection(upload(sut, bytes, 1000, sha256(Buffer.from('other'))));
    expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_ARTIFACT']);
    const missing = await rpcRejection(download(sut, sha256(bytes)));
    expect([missing.code, missing.reason]).toEqual([status.NOT_FOUND, 'ARTIFACT_NOT_FOUND']);
  });

  it('stores nothing from an upload the client cancels midway', async () => {
    const controller = new AbortController();
    const incoming = join(dataDir, 'artifacts', '.incoming');
    async function* cancelled(): AsyncGenerator<UploadMessage> {
      yield { chunk: randomBytes(1000) };
      yield { chunk: randomBytes(1000) };
      // Cancelled once the registry has begun to store the upload.
      await eventually(() => readdirSync(incoming).length > 0);
      controller.abort();
    }
    const error = await rpcRejection(sut.uploadArtifact(cancelled(), { signal: controller.signal }));
    expect(error.code).toBe(status.CANCELLED);
    await eventually(() => readdirSync(incoming).length === 0);
    expect(readdirSync(incoming)).toEqual([]);
    expect(readdirSync(join(dataDir, 'artifacts')).filter((f) => f !== '.incoming')).toEqual([]);
  });

  it('resolves the highest-numbered READY version and lists versions in numeric order', async () => {
    const tiny = buildTinyModel().bytes;
    for (const versionId of ['10', '2', '3']) await register('tiny', versionId, tiny);
    await ready('tiny', '2');
    await ready('tiny', '3');
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/3');
    await ready('tiny', '10');
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/10');

    await register('alpha', '1', tiny);
    const { models } = await sut.listModels({});
    expect(models.map((m) => [m.name, m.platform, m.versions.map((v) => v.name)])).toEqual([
      ['models/alpha', 'onnxruntime_onnx', ['models/alpha/versions/1']],
      [
        'models/tiny',
        'onnxruntime_onnx',
        ['models/tiny/versions/2', 'models/tiny/versions/3', 'models/tiny/versions/10'],
      ],
    ]);
  });

  it('records a FAILED report with its reason, and answers NOT_FOUND for unknown models and versions', async () => {
    await register('tiny', '1', buildTinyModel().bytes);
    const failed = await sut.reportVersionState({
      name: 'models/tiny/versions/1',
      state: VersionState.FAILED,
      stateReason: 'out of memory',
      workerId: 'w',
    });
    expect(failed.version).toMatchObject({ state: VersionState.FAILED, stateReason: 'out of memory' });
    expect((await sut.getModel({ name: 'models/tiny' })).model!.versions[0]!.stateReason).toBe('out of memory');

    const noVersion = await rpcRejection(ready('tiny', '2'));
    expect([noVersion.code, noVersion.reason]).toEqual([status.NOT_FOUND, 'VERSION_NOT_FOUND']);
    const noModel = await rpcRejection(ready('nope', '1'));
    expect([noModel.code, noModel.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
    const resolveMissing = await rpcRejection(sut.resolveModelVersion({ model: 'models/tiny', versionId: '7' }));
    expect([resolveMissing.code, resolveMissing.reason]).toEqual([status.NOT_FOUND, 'VERSION_NOT_FOUND']);
    const resolveUnknown = await rpcRejection(sut.resolveModelVersion({ model: 'models/nope' }));
    expect([resolveUnknown.code, resolveUnknown.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
  });

  it('refuses malformed names and version ids with INVALID_ARGUMENT', async () => {
    const sha = sha256(buildTinyModel().bytes);
    const cases: (() => Promise<unknown>)[] = [
      () => sut.createModelVersion({ parent: 'tiny', versionId: '1', artifactSha256: sha }),
      () => sut.createModelVersion({ parent: 'models/-bad', versionId: '1', artifactSha256: sha }),
      () => sut.createModelVersion({ parent: 'models/tiny', versionId: '0', artifactSha256: sha }),
      () => sut.createModelVersion({ parent: 'models/tiny', versionId: 'v1', artifactSha256: sha }),
      () => sut.createModelVersion({ parent: 'models/tiny', versionId: '1', artifactSha256: '../etc/passwd' }),
      () => sut.resolveModelVersion({ model: 'models/tiny', versionId: '01' }),
      () => sut.reportVersionState({ name: 'models/tiny', state: VersionState.READY }),
      () => sut.reportVersionState({ name: 'models/tiny/versions/1', state: VersionState.RETIRED }),
      () => download(sut, 'not-a-sha'),
    ];
    for (const call of cases) expect((await rpcRejection(call())).code).toBe(status.INVALID_ARGUMENT);
  });

  it('keeps models, versions and states across a restart', async () => {
    const tiny = buildTinyModel().bytes;
    await register('tiny', '1', tiny);
    await ready('tiny', '1');
    await stop();
    await start();
    expect((await sut.resolveModelVersion({ model: 'models/tiny' })).version!.name).toBe('models/tiny/versions/1');
    expect(Buffer.compare(await download(sut, sha256(tiny)), Buffer.from(tiny))).toBe(0);
  });

  it('refuses an upload that is not an ONNX model, or that onnxruntime cannot load, and leaves nothing behind', async () => {
    const unknownOp = encodeModel('unknown-op', {
      nodes: [node('NoSuchOperator', ['input'], ['output'], 'mystery')],
      initializers: [],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 4] }],
    }).bytes;
    const cases: [Uint8Array, RegExp][] = [
      [Buffer.from('garbage bytes, not a model'), /^the artifact is not a valid ONNX model: /],
      [unknownOp, /^onnxruntime cannot load the artifact: .*NoSuchOperator.*; nothing was stored$/s],
    ];
    for (const [bytes, message] of cases) {
      const error = await rpcRejection(upload(sut, bytes, 100, sha256(bytes)));
      expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_ARTIFACT']);
      expect(error.message).toMatch(message);
      expect((await rpcRejection(download(sut, sha256(bytes)))).reason).toBe('ARTIFACT_NOT_FOUND');
    }
    expect(readdirSync(join(dataDir, 'artifacts')).filter((f) => f !== '.incoming')).toEqual([]);
    expect(readdirSync(join(dataDir, 'artifacts', '.incoming'))).toEqual([]);
    const body = await (await fetch(`http://127.0.0.1:${running.metricsPort}/metrics`)).text();
    expect(body).toMatch(/^infermesh_registry_artifact_uploads_total\{outcome="invalid"\} 2$/m);
  });

  it('changes labels, pinned, the version policy and unloaded with UpdateModel, only those the mask names', async () => {
    for (const id of ['1', '2']) {
      await register('tiny', id, buildTinyModel().bytes);
      await ready('tiny', id);
    }
    const { model } = await sut.updateModel({
      model: {
        name: 'models/tiny',
        labels: { team: 'vision' },
        pinned: true,
        versionPolicy: { policy: { case: 'latest', value: 2 } },
        unloaded: true,
      },
      updateMask: { paths: ['labels', 'pinned', 'version_policy'] },
    });
    expect([model!.labels, model!.pinned, model!.versionPolicy?.policy, model!.unloaded]).toEqual([
      { team: 'vision' },
      true,
      { case: 'latest', value: 2 },
      false,
    ]);
    expect(model!.versions.map((v) => v.state)).toEqual([VersionState.READY, VersionState.READY]);
    expect((await sut.getModel({ name: 'models/tiny' })).model).toEqual(model);

    const bad = await rpcRejection(
      sut.updateModel({ model: { name: 'models/tiny' }, updateMask: { paths: ['versions'] } }),
    );
    expect([bad.code, bad.message]).toEqual([
      status.INVALID_ARGUMENT,
      'update_mask: "versions" cannot be changed with UpdateModel; only labels, pinned, version_policy, unloaded can (versions, rollout and cache have their own RPCs)',
    ]);
    const missing = await rpcRejection(
      sut.updateModel({ model: { name: 'models/none' }, updateMask: { paths: ['pinned'] } }),
    );
    expect([missing.code, missing.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
  });

  it('retires a version and deletes a model only once nothing takes traffic, with FAILED_PRECONDITION until then', async () => {
    for (const id of ['1', '2']) {
      await register('tiny', id, buildTinyModel().bytes);
      await ready('tiny', id);
    }
    const inUse = await rpcRejection(sut.retireModelVersion({ name: 'models/tiny/versions/2' }));
    expect([inUse.code, inUse.reason]).toEqual([status.FAILED_PRECONDITION, 'VERSION_IN_USE']);
    expect(inUse.message).toMatch(
      /^version 2 of model tiny still serves traffic: it is the latest READY version under version policy latest 1/,
    );
    const retired = await sut.retireModelVersion({ name: 'models/tiny/versions/1' });
    expect(retired.version).toMatchObject({ name: 'models/tiny/versions/1', state: VersionState.DRAINING });
    expect((await rpcRejection(sut.retireModelVersion({ name: 'models/tiny/versions/3' }))).reason).toBe(
      'VERSION_NOT_FOUND',
    );

    const loaded = await rpcRejection(sut.deleteModel({ name: 'models/tiny' }));
    expect([loaded.code, loaded.reason]).toEqual([status.FAILED_PRECONDITION, 'MODEL_IN_USE']);
    expect(loaded.message).toContain('`infermesh models unload tiny` or POST /v2/repository/models/tiny/unload');

    await register('never-loaded', '1', buildTinyModel().bytes);
    await sut.deleteModel({ name: 'models/never-loaded' });
    expect((await rpcRejection(sut.getModel({ name: 'models/never-loaded' }))).reason).toBe('MODEL_NOT_FOUND');
    expect((await rpcRejection(sut.deleteModel({ name: 'models/never-loaded' }))).code).toBe(status.NOT_FOUND);
  });

  it('retires drained versions after REGISTRY_DRAIN_GRACE_MS without being asked', async () => {
    const clock = new ManualClock();
    await stop();
    await start({ REGISTRY_DRAIN_GRACE_MS: '10000' }, clock);
    for (const id of ['1', '2']) {
      await register('tiny', id, buildTinyModel().bytes);
      await ready('tiny', id);
    }
    const states = async () =>
      (await sut.getModel({ name: 'models/tiny' })).model!.versions.map((v) => VersionState[v.state]);
    expect(await states()).toEqual(['DRAINING', 'READY']);

    // The grace passes on the registry's clock; then its sweeper, one sweep period (1 s) at a time.
    clock.advance(10_000);
    await eventually(async () => {
      clock.advance(1_000);
      return (await states())[0] !== 'DRAINING';
    });
    expect(await states()).toEqual(['RETIRED', 'READY']);
  });

  it('streams the models with WatchModels: a snapshot, then each change and deletion, until the client cancels', async () => {
    await register('tiny', '1', buildTinyModel().bytes);
    const controller = new AbortController();
    const stream = sut.watchModels({ fromRevision: 0n }, { signal: controller.signal })[Symbol.asyncIterator]();
    const next = async () => (await stream.next()).value as WatchModelsResponse;

    const snapshot = await next();
    expect([snapshot.snapshot, snapshot.models.map((m) => m.name)]).toEqual([true, ['models/tiny']]);
    expect(snapshot.revision).toBe(snapshot.models[0]!.revision);

    const { model } = await sut.updateModel({
      model: { name: 'models/tiny', pinned: true },
      updateMask: { paths: ['pinned'] },
    });
    const change = await next();
    expect(change).toEqual(create(WatchModelsResponseSchema, { revision: model!.revision, models: [model!] }));

    await sut.deleteModel({ name: 'models/tiny' });
    const deletion = await next();
    expect([deletion.revision, deletion.models, deletion.deleted]).toEqual([model!.revision + 1n, [], ['models/tiny']]);

    // A follower that is current gets only the revision first.
    const current = sut.watchModels({ fromRevision: deletion.revision })[Symbol.asyncIterator]();
    expect((await current.next()).value).toEqual(create(WatchModelsResponseSchema, { revision: deletion.revision }));
    await current.return?.();

    controller.abort();
    expect((await rpcRejection(stream.next())).code).toBe(status.CANCELLED);
    const metrics = async () => (await fetch(`http://127.0.0.1:${running.metricsPort}/metrics`)).text();
    await eventually(async () => /^infermesh_registry_watchers 0$/m.test(await metrics()));
    expect(await metrics()).toMatch(/^infermesh_registry_watchers 0$/m);
  });

  it('ends WatchModels streams when it shuts down, without waiting for the followers', async () => {
    const stream = sut.watchModels({})[Symbol.asyncIterator]();
    expect((await stream.next()).value).toMatchObject({ snapshot: true, models: [] });
    const pending = stream.next();
    await stop();
    expect((await pending).done).toBe(true);
    await start();
  });

  it('exports model and version gauges and the artifact bytes stored', async () => {
    const tiny = buildTinyModel().bytes;
    await register('tiny', '1', tiny);
    await register('tiny', '2', tiny);
    await ready('tiny', '2');
    const body = await (await fetch(`http://127.0.0.1:${running.metricsPort}/metrics`)).text();
    expect(body).toMatch(/^infermesh_registry_models 1$/m);
    expect(body).toMatch(/^infermesh_registry_model_versions\{state="READY"\} 1$/m);
    // Version 1 never loaded and left the serving set (latest 1) once version 2 was READY.
    expect(body).toMatch(/^infermesh_registry_model_versions\{state="RETIRED"\} 1$/m);
    expect(body).toMatch(/^infermesh_registry_model_versions\{state="REGISTERED"\} 0$/m);
    expect(body).toMatch(new RegExp(`^infermesh_registry_artifact_stored_bytes_total ${tiny.length}$`, 'm'));
    expect(body).toMatch(/^infermesh_registry_artifact_uploads_total\{outcome="deduplicated"\} 1$/m);
    expect(body).toMatch(
      /infermesh_registry_grpc_server_handling_seconds_count\{method="RegistryService\/CreateModelVersion",code="OK"\} 2/,
    );
  });
});

describe(`${RegistryGrpcController.name} with Redis down`, () => {
  it('answers UNAVAILABLE, not INTERNAL, while the model store is unreachable', async () => {
    const redis = await startRedisServer();
    const dataDir = mkdtempSync(join(tmpdir(), 'infermesh-registry-e2e-'));
    const config = loadRegistryConfig({
      REGISTRY_GRPC_PORT: '0',
      REGISTRY_METRICS_PORT: '0',
      REGISTRY_LOG_LEVEL: 'error',
      REGISTRY_DATA_DIR: dataDir,
      REDIS_URL: redis.url,
    });
    const running = await bootstrap({
      module: RegistryModule.forRoot(config),
      grpc: (app) => [bind(RegistryService, app.get(RegistryGrpcController))],
    });
    const sut = createClient(RegistryService, `127.0.0.1:${running.grpcPort}`);
    try {
      const { artifact } = await upload(sut, buildTinyModel().bytes);
      await sut.createModelVersion({ parent: 'models/tiny', versionId: '1', artifactSha256: artifact!.sha256 });
      await redis.stop();
      const error = await rpcRejection(sut.getModel({ name: 'models/tiny' }));
      expect(error.code).toBe(status.UNAVAILABLE);
      expect(error.message).toMatch(/model store is unavailable/);
      // Artifacts live on the filesystem and stay available.
      expect(Buffer.compare(await download(sut, artifact!.sha256), Buffer.from(buildTinyModel().bytes))).toBe(0);
    } finally {
      sut.close();
      await running.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
