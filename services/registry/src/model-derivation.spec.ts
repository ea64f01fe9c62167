import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type BuiltModel,
  buildClassifierModel,
  buildCnnModel,
  buildMlpModel,
  buildQuantizedFormModel,
  buildTinyModel,
  CLASSIFIER_PROCESSING,
  encodeModel,
  floatInitializer,
  node,
} from '@infermesh/model-builder';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  BatchingSchema,
  CreateModelVersionRequestSchema,
  ExecutionSchema,
  ProcessingSchema,
  QuantizeModelVersionRequestSchema,
  VersionState,
  type WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { rpcRejection } from '@infermesh/testing';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chunksOf } from './artifact-store';
import { FilesystemArtifactStore } from './artifact-store.filesystem';
import { systemClock } from '@infermesh/clock';
import { ModelCatalog } from './model-catalog';
import {
  DEFAULT_MAX_RELATIVE_L2,
  MAX_CALIBRATION_ELEMENTS,
  ModelDerivation,
  QUANTIZATION_METHOD,
} from './model-derivation';
import { EmbeddedModelStore } from './model-store.embedded';
import { ModelWatch } from './model-watch';
import { OnnxRuntime } from './onnx-runtime.adapter';
import { loadRegistryConfig, type RegistryConfig } from './registry.config';

type QuantizeInit = MessageInitShape<typeof QuantizeModelVersionRequestSchema>;
/** What a version is registered with besides its artifact. */
interface CreateInit {
  maxBatchSize?: number;
  processing?: MessageInitShape<typeof ProcessingSchema>;
  batching?: MessageInitShape<typeof BatchingSchema>;
  warmUp?: MessageInitShape<typeof WarmUpSchema>;
  execution?: MessageInitShape<typeof ExecutionSchema>;
}

/** The small MLP of the tests: 64 -> 128 -> 32, about 49 KB of float weights. */
const mlp = buildMlpModel({ sizes: [64, 128, 32] });

const sha256Of = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

/** Row-major little-endian FP32 elements, as WarmUpInput.data. */
const fp32 = (values: readonly number[]) => new Uint8Array(Float32Array.from(values).buffer);

/** input [-1, 4] · W, then the column that "index" (INT64 [1]) picks: an index out of range fails the run. */
function pickerModel(): BuiltModel {
  return encodeModel('picker', {
    nodes: [
      node('MatMul', ['input', 'w'], ['h'], 'dense'),
      node('Gather', ['h', 'index'], ['output'], 'pick', [{ name: 'axis', type: 2, i: 1 }]),
    ],
    initializers: [
      floatInitializer(
        'w',
        [4, 4],
        Float32Array.from({ length: 16 }, (_, i) => Math.sin(i)),
      ),
    ],
    inputs: [
      { name: 'input', datatype: 'FP32', shape: [-1, 4] },
      { name: 'index', datatype: 'INT64', shape: [1] },
    ],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 1] }],
  });
}

describe(ModelDerivation.name, () => {
  let dir: string;
  let config: RegistryConfig;
  let logger: JsonLogger;
  let metrics: Metrics;
  let artifacts: FilesystemArtifactStore;
  let catalog: ModelCatalog;
  let sut: ModelDerivation;

  /** A catalog over the metadata file as the registry keeps it, with its own store (and metrics, as a registry started again). */
  function openCatalog(on: Metrics = metrics): ModelCatalog {
    const store = new EmbeddedModelStore(config.metadataFile);
    return new ModelCatalog(
      store,
      artifacts,
      systemClock,
      config,
      logger,
      new ModelWatch(store, config, logger, on),
      on,
    );
  }

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'infermesh-derivation-'));
    config = loadRegistryConfig({ REGISTRY_DATA_DIR: dir });
    logger = new JsonLogger('test', 'error');
    metrics = new Metrics('registry');
    artifacts = new FilesystemArtifactStore(config.artifactDir);
    catalog = openCatalog();
    sut = new ModelDerivation(catalog, artifacts, new OnnxRuntime(), config, logger, metrics);
  });
  afterEach(async () => {
    await catalog.onApplicationShutdown();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Uploads the model's bytes and registers them as models/{model}/versions/{versionId}, with its processing unless init says otherwise. */
  async function register(model: string, versionId: string, built: BuiltModel = mlp, init: CreateInit = {}) {
    const { sha256 } = await artifacts.write(chunksOf(built.bytes), { maxBytes: config.maxArtifactBytes });
    return catalog.createVersion(
      create(CreateModelVersionRequestSchema, {
        parent: `models/${model}`,
        versionId,
        artifactSha256: sha256,
        ...(built.processing && { processing: built.processing }),
        ...init,
      }),
    );
  }
  const quantize = (init: QuantizeInit) => sut.quantize(create(QuantizeModelVersionRequestSchema, init));
  /** The artifacts in the store's directory, by SHA-256. */
  const storedArtifacts = () => readdirSync(config.artifactDir).filter((f) => !f.startsWith('.'));
  const versionIds = async (model: string) =>
    (await catalog.getModel(`models/${model}`)).versions.map((v) => v.name.slice(v.name.lastIndexOf('/') + 1));

  /** version_derivations_total{method="dynamic_int8", outcome} as the registry's metrics registry holds it. */
  async function derivations(outcome: string): Promise<number> {
    const metric = metrics.registry.getSingleMetric('infermesh_registry_version_derivations_total');
    if (metric === undefined) throw new Error('no metric version_derivations_total');
    const { values } = await metric.get();
    return values.find((v) => v.labels.method === QUANTIZATION_METHOD && v.labels.outcome === outcome)?.value ?? 0;
  }

  describe('a derived version', () => {
    it('is the next version of the source model: smaller, with its lineage and the figures of the accuracy gate, and survives a re-read of the catalog', async () => {
      const source = await register('m', '1', mlp, { maxBatchSize: 4 });

      const derived = await quantize({ source: 'models/m/versions/1' });

      expect([derived.name, derived.state]).toEqual(['models/m/versions/2', VersionState.REGISTERED]);
      const lineage = derived.lineage!;
      expect(lineage).toMatchObject({
        sourceVersion: 'models/m/versions/1',
        sourceSha256: source.artifact!.sha256,
        method: 'dynamic_int8',
        settings: { perChannel: true, quantizeConv: false, reduceRange: true },
        floatNodes: [],
      });
      expect(lineage.sourceSha256).toBe(sha256Of(mlp.bytes));
      expect(lineage.quantizedNodes.map((q) => [q.node, q.opType, q.weight, q.elements])).toEqual([
        ['fc0_matmul', 'MatMul', 'fc0.weight', 64n * 128n],
        ['fc1_matmul', 'MatMul', 'fc1.weight', 128n * 32n],
      ]);
      // 4 synthetic samples at batch min(8, max batch size 4): 16 rows of 32 classes compared.
      const accuracy = lineage.accuracy!;
      expect(accuracy).toMatchObject({
        samples: 4,
        synthetic: true,
        maxRelativeL2: DEFAULT_MAX_RELATIVE_L2,
        comparedItems: 16,
      });
      expect(accuracy.relativeL2).toBeGreaterThan(0);
      expect(accuracy.relativeL2).toBeLessThanOrEqual(0.02);
      expect(accuracy.maxAbsDiff).toBeGreaterThan(0);
      expect(accuracy.agreedItems).toBeLessThanOrEqual(16);
      expect(accuracy.agreedItems).toBeGreaterThan(8);

      // The stored artifact is the int8 model: another, smaller artifact with the same signature.
      const artifact = derived.artifact!;
      expect(artifact.sha256).not.toBe(source.artifact!.sha256);
      const stored = await artifacts.readAll(artifact.sha256);
      expect(stored?.length).toBe(Number(artifact.sizeBytes));
      expect(artifact.sizeBytes).toBeLessThan(source.artifact!.sizeBytes / 2n);
      expect(derived.signature).toEqual(source.signature);
      expect(derived.signature!.maxBatchSize).toBe(4);

      // Another catalog over the same metadata file reads the version back, lineage and all.
      const reread = openCatalog(new Metrics('registry'));
      try {
        const model = await reread.getModel('models/m');
        expect(model.versions.map((v) => v.name)).toEqual(['models/m/versions/1', 'models/m/versions/2']);
        expect(model.versions[1]).toEqual(derived);
        expect(model.versions[0]!.lineage).toBeUndefined();
      } finally {
        await reread.onApplicationShutdown();
      }
    });

    it('keeps the processing, batching, warm-up and max batch size of its source', async () => {
      const batching = { maxBatchSize: 6, maxQueueDelayUs: 500n, preferredBatchSizes: [2, 4], maxQueueSize: 40 };
      const warmUp = {
        samples: [
          {
            name: 'ones',
            inputs: [
              {
                name: 'input',
                shape: [2n, 4n],
                contents: { case: 'data' as const, value: fp32([1, 1, 1, 1, 2, 2, 2, 2]) },
              },
            ],
          },
        ],
      };
      const source = await register('classifier', '3', buildClassifierModel(), {
        maxBatchSize: 12,
        batching,
        warmUp,
        execution: { intraOpThreads: 2 },
      });
      expect(source.processing).toEqual(create(ProcessingSchema, CLASSIFIER_PROCESSING));

      const derived = await quantize({ source: 'models/classifier/versions/3' });

      expect(derived.name).toBe('models/classifier/versions/4');
      expect(derived.signature!.maxBatchSize).toBe(12);
      expect(derived.processing).toEqual(create(ProcessingSchema, CLASSIFIER_PROCESSING));
      expect(derived.batching).toEqual(create(BatchingSchema, batching));
      expect(derived.warmUp).toEqual(source.warmUp);
      expect(derived.warmUp!.samples).toHaveLength(1);
      expect(derived.execution).toEqual(create(ExecutionSchema, { intraOpThreads: 2 }));
      expect(derived.lineage!.quantizedNodes.map((q) => q.node)).toEqual(['matmul']);
    });

    it('runs with the operator threads the request asks for, refusing more than 256 before any work', async () => {
      await register('mlp', '1', mlp, { execution: { intraOpThreads: 2 } });
      const one = await quantize({ source: 'models/mlp/versions/1', execution: { intraOpThreads: 1 } });
      expect(one.execution).toEqual(create(ExecutionSchema, { intraOpThreads: 1 }));
      const stored = storedArtifacts().length;
      const error = await rpcRejection(
        quantize({ source: 'models/mlp/versions/1', execution: { intraOpThreads: 257 } }),
      );
      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(error.message).toBe("execution: intra_op_threads is 257; it can be at most 256 (0: the worker's default)");
      expect(storedArtifacts()).toHaveLength(stored);
      expect(await versionIds('mlp')).toEqual(['1', '2']);
    });

    it('records the settings it was derived with: Convs stay in float unless asked, saying why, and are quantized when asked', async () => {
      const cnn = buildCnnModel({ channels: [4, 8] });
      await register('cnn', '1', cnn);

      const byDefault = (await quantize({ source: 'models/cnn/versions/1' })).lineage!;
      expect(byDefault.settings).toMatchObject({ perChannel: true, quantizeConv: false });
      expect(byDefault.quantizedNodes.map((q) => q.node)).toEqual(['fc_matmul']);
      expect(byDefault.floatNodes.map((f) => [f.node, f.opType, f.reason])).toEqual([
        ['conv0_conv', 'Conv', 'Conv is not among the operators asked for (MatMul, Gemm)'],
        ['conv1_conv', 'Conv', 'Conv is not among the operators asked for (MatMul, Gemm)'],
      ]);

      const withConv = await quantize({
        source: 'models/cnn/versions/1',
        settings: { quantizeConv: true, perChannel: false },
        maxRelativeL2: 0.1,
      });
      expect(withConv.name).toBe('models/cnn/versions/3');
      const lineage = withConv.lineage!;
      expect(lineage.settings).toMatchObject({ perChannel: false, quantizeConv: true });
      expect(lineage.quantizedNodes.map((q) => [q.node, q.opType])).toEqual([
        ['conv0_conv', 'Conv'],
        ['conv1_conv', 'Conv'],
        ['fc_matmul', 'MatMul'],
      ]);
      expect(lineage.floatNodes).toEqual([]);
      expect(lineage.accuracy!.maxRelativeL2).toBe(0.1);
      expect(withConv.artifact!.sha256).not.toBe((await catalog.getModel('models/cnn')).versions[1]!.artifact!.sha256);
    });

    it('records 8-bit weights when asked for the full range', async () => {
      await register('m', '1');
      // The gate is wide: on an x86 CPU without VNNI full-range weights overflow onnxruntime's kernel.
      const full = await quantize({
        source: 'models/m/versions/1',
        settings: { reduceRange: false },
        maxRelativeL2: 10,
      });
      const lineage = full.lineage!;
      expect(lineage.settings).toMatchObject({ perChannel: true, quantizeConv: false, reduceRange: false });
      expect(lineage.quantizedNodeCount).toBe(2);
      expect(lineage.floatNodeCount).toBe(0);
    });
  });

  describe('the source', () => {
    it('named by its model alone is the version that serves: the READY one, not a later one still loading', async () => {
      await register('m', '1');
      await catalog.reportState('models/m/versions/1', VersionState.READY, '', 'worker-1');
      await register('m', '2', buildMlpModel({ sizes: [64, 128, 32], seed: 7 }));
      expect((await catalog.getModel('models/m')).versions.map((v) => VersionState[v.state])).toEqual([
        'READY',
        'REGISTERED',
      ]);

      const derived = await quantize({ source: 'models/m' });

      expect(derived.name).toBe('models/m/versions/3');
      expect(derived.lineage!.sourceVersion).toBe('models/m/versions/1');
      expect(derived.lineage!.sourceSha256).toBe(sha256Of(mlp.bytes));
    });

    it('named by its model alone is refused with FAILED_PRECONDITION naming the model when no version is READY', async () => {
      await register('m', '1');

      const error = await rpcRejection(quantize({ source: 'models/m' }));

      expect([error.code, error.reason, error.message]).toEqual([
        status.FAILED_PRECONDITION,
        'VERSION_NOT_READY',
        'models/m has no READY version to derive from; name one (models/{model}/versions/{version})',
      ]);
      expect(await versionIds('m')).toEqual(['1']);
    });

    it('that does not exist is NOT_FOUND: an unknown model, or an unknown version of a known one', async () => {
      await register('m', '1');

      const model = await rpcRejection(quantize({ source: 'models/none/versions/1' }));
      expect([model.code, model.reason, model.message]).toEqual([
        status.NOT_FOUND,
        'MODEL_NOT_FOUND',
        'model "none" not found',
      ]);
      const byModel = await rpcRejection(quantize({ source: 'models/none' }));
      expect([byModel.code, byModel.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
      const version = await rpcRejection(quantize({ source: 'models/m/versions/9' }));
      expect([version.code, version.reason, version.message]).toEqual([
        status.NOT_FOUND,
        'VERSION_NOT_FOUND',
        'models/m has no version 9',
      ]);
      expect(await versionIds('m')).toEqual(['1']);
    });

    it('with nothing to quantize is refused with FAILED_PRECONDITION (NOT_QUANTIZABLE) naming the version, registering nothing', async () => {
      await register('q', '1', buildQuantizedFormModel('dynamic-quantize-linear'));

      const error = await rpcRejection(quantize({ source: 'models/q/versions/1', targetModel: 'models/q-int8' }));

      expect([error.code, error.reason]).toEqual([status.FAILED_PRECONDITION, 'NOT_QUANTIZABLE']);
      expect(error.message).toMatch(/^models\/q\/versions\/1 cannot be quantized: nothing to quantize/);
      expect(await versionIds('q')).toEqual(['1']);
      expect((await rpcRejection(catalog.getModel('models/q-int8'))).reason).toBe('MODEL_NOT_FOUND');
    });
  });

  describe('the target', () => {
    it('is the target model when given, created with version 1, and the source model keeps its versions', async () => {
      await register('m', '1');

      const derived = await quantize({ source: 'models/m/versions/1', targetModel: 'models/m-int8' });

      expect(derived.name).toBe('models/m-int8/versions/1');
      expect(derived.lineage!.sourceVersion).toBe('models/m/versions/1');
      expect(await versionIds('m-int8')).toEqual(['1']);
      expect(await versionIds('m')).toEqual(['1']);

      // A target model that exists gets its next version.
      const again = await quantize({ source: 'models/m/versions/1', targetModel: 'models/m-int8' });
      expect(again.name).toBe('models/m-int8/versions/2');
    });

    it('takes the version id given, in the source model or the target model', async () => {
      await register('m', '1');

      expect((await quantize({ source: 'models/m/versions/1', versionId: '7' })).name).toBe('models/m/versions/7');
      expect(
        (await quantize({ source: 'models/m/versions/1', targetModel: 'models/m-int8', versionId: '5' })).name,
      ).toBe('models/m-int8/versions/5');
      expect(await versionIds('m')).toEqual(['1', '7']);
      expect(await versionIds('m-int8')).toEqual(['5']);
      // Next after the highest id, not after the count of versions.
      expect((await quantize({ source: 'models/m/versions/1' })).name).toBe('models/m/versions/8');
    });

    it('refuses a version id or a target model that is not one with INVALID_ARGUMENT, before storing anything', async () => {
      await register('m', '1');

      const version = await rpcRejection(quantize({ source: 'models/m/versions/1', versionId: 'v2' }));
      expect([version.code, version.message]).toEqual([
        status.INVALID_ARGUMENT,
        'invalid version id "v2": expected a positive integer such as "1"',
      ]);
      const target = await rpcRejection(quantize({ source: 'models/m/versions/1', targetModel: 'm-int8' }));
      expect([target.code, target.message]).toEqual([
        status.INVALID_ARGUMENT,
        'target_model must be "models/{model}", got "m-int8"',
      ]);
      expect(await versionIds('m')).toEqual(['1']);
      expect(storedArtifacts()).toEqual([sha256Of(mlp.bytes)]);
    });
  });

  describe('calibration', () => {
    it('runs both models on the samples given, with data or random data, and reports them as not synthetic', async () => {
      await register('m', '1');
      const rows = (n: number) => Array.from({ length: n * 64 }, (_, i) => Math.sin(i) * 2);
      const calibration = [
        {
          name: 'given',
          inputs: [{ name: 'input', shape: [2n, 64n], contents: { case: 'data' as const, value: fp32(rows(2)) } }],
        },
        {
          inputs: [
            {
              name: 'input',
              datatype: DataType.FP32,
              shape: [3n, 64n],
              contents: { case: 'randomData' as const, value: true },
            },
          ],
        },
      ];

      const accuracy = (await quantize({ source: 'models/m/versions/1', calibration })).lineage!.accuracy!;

      // 2 + 3 rows of 32 classes, not the 4 × 8 of synthetic calibration.
      expect(accuracy).toMatchObject({
        samples: 2,
        synthetic: false,
        comparedItems: 5,
        maxRelativeL2: DEFAULT_MAX_RELATIVE_L2,
      });
      expect(accuracy.relativeL2).toBeGreaterThan(0);
      expect(accuracy.relativeL2).toBeLessThanOrEqual(0.02);
    });

    it('refuses a sample naming an input the model does not have with INVALID_ARGUMENT, checked as a warm-up is but named calibration', async () => {
      await register('m', '1');
      const calibration = [
        {
          name: 'bad',
          inputs: [{ name: 'pixels', shape: [1n, 64n], contents: { case: 'zeroData' as const, value: true } }],
        },
      ];

      const error = await rpcRejection(quantize({ source: 'models/m/versions/1', calibration }));

      expect([error.code, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        'calibration: samples[0] ("bad"): the model has no input "pixels"; its inputs are "input"',
      ]);
      expect(await versionIds('m')).toEqual(['1']);
    });

    it('is refused with INVALID_ARGUMENT when a sample does not fit the signature', async () => {
      await register('m', '1');
      const calibration = [
        { inputs: [{ name: 'input', shape: [1n, 63n], contents: { case: 'randomData' as const, value: true } }] },
      ];

      const error = await rpcRejection(quantize({ source: 'models/m/versions/1', calibration }));

      expect([error.code, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        'calibration: samples[0] input "input" has shape [1,63] but the model expects [-1,64]; give a concrete size (0 or more) for each -1',
      ]);
    });
    it('is refused with INVALID_ARGUMENT when its samples hold more input elements in all than MAX_CALIBRATION_ELEMENTS', async () => {
      // A model that does not batch: any first dimension. Each sample is within the warm-up limits
      // (16 samples, 16,777,216 elements each); together they are not.
      await register('m', '1', mlp, { maxBatchSize: 0 });
      const rows = Math.floor(MAX_CALIBRATION_ELEMENTS / 64 / 4) + 1;
      const calibration = Array.from({ length: 4 }, () => ({
        inputs: [{ name: 'input', shape: [BigInt(rows), 64n], contents: { case: 'randomData' as const, value: true } }],
      }));

      const error = await rpcRejection(quantize({ source: 'models/m/versions/1', calibration }));

      expect([error.code, error.message]).toEqual([
        status.INVALID_ARGUMENT,
        `calibration: the samples have ${4 * rows * 64} input elements in all, above the limit of ${MAX_CALIBRATION_ELEMENTS} (MAX_CALIBRATION_ELEMENTS); give fewer or smaller samples`,
      ]);
      expect(await versionIds('m')).toEqual(['1']);
    });

    it('names the sample the source cannot run on', async () => {
      // An index out of range fails the run.
      const picker = pickerModel();
      await register('m', '1', picker);
      const sample = (name: string, index: bigint) => ({
        name,
        inputs: [
          { name: 'input', shape: [2n, 4n], contents: { case: 'randomData' as const, value: true } },
          {
            name: 'index',
            shape: [1n],
            contents: { case: 'data' as const, value: new Uint8Array(BigInt64Array.of(index).buffer) },
          },
        ],
      });

      const error = await rpcRejection(
        quantize({ source: 'models/m/versions/1', calibration: [sample('fine', 2n), sample('out of range', 7n)] }),
      );

      expect(error.code).toBe(status.INVALID_ARGUMENT);
      expect(error.message).toMatch(/^the source cannot run on calibration samples\[1\] \("out of range"\): .*indices/);
      expect(await versionIds('m')).toEqual(['1']);
    });
  });

  describe('the accuracy gate', () => {
    it('refuses a variant above it with FAILED_PRECONDITION (ACCURACY_GATE), giving the figures, and registers and stores nothing', async () => {
      await register('m', '1');

      const error = await rpcRejection(
        quantize({ source: 'models/m/versions/1', targetModel: 'models/m-int8', maxRelativeL2: 1e-6 }),
      );

      expect([error.code, error.reason]).toEqual([status.FAILED_PRECONDITION, 'ACCURACY_GATE']);
      expect(error.metadata).toMatchObject({ source: 'models/m/versions/1', max_relative_l2: '0.000001' });
      const relativeL2 = Number(error.metadata.relative_l2);
      const maxAbsDiff = Number(error.metadata.max_abs_diff);
      expect(relativeL2).toBeGreaterThan(1e-6);
      expect(relativeL2).toBeLessThanOrEqual(0.02);
      expect(maxAbsDiff).toBeGreaterThan(0);
      expect(Number(error.metadata.top1_agreement)).toBeGreaterThan(0.5);
      // The message gives the same figures: 4 synthetic samples of 8 rows, each of 32 classes.
      expect(error.message).toMatch(
        new RegExp(
          `^the int8 variant of models/m/versions/1 is refused: its error is above the gate of relative L2 0\\.000001 ` +
            `\\(relative L2 ${relativeL2.toPrecision(3)}, max abs diff ${maxAbsDiff.toPrecision(3)}, top-1 agreement [\\d.]+ % \\(\\d+ of 32\\), 4 synthetic samples\\); nothing was registered$`,
        ),
      );

      expect((await rpcRejection(catalog.getModel('models/m-int8'))).reason).toBe('MODEL_NOT_FOUND');
      expect(await versionIds('m')).toEqual(['1']);
      expect(storedArtifacts()).toEqual([sha256Of(mlp.bytes)]);
      // The same variant (the synthetic inputs are the same on every run) passes a gate of exactly its error: the gate is inclusive.
      const passed = await quantize({
        source: 'models/m/versions/1',
        targetModel: 'models/m-int8',
        maxRelativeL2: relativeL2,
      });
      expect(passed.lineage!.accuracy).toMatchObject({ relativeL2, maxRelativeL2: relativeL2 });
      expect(storedArtifacts().sort()).toEqual([sha256Of(mlp.bytes), passed.artifact!.sha256].sort());
    });

    it('at 0 refuses any error at all', async () => {
      await register('t', '1', buildTinyModel());

      const error = await rpcRejection(quantize({ source: 'models/t/versions/1', maxRelativeL2: 0 }));

      expect([error.code, error.reason, error.metadata.max_relative_l2]).toEqual([
        status.FAILED_PRECONDITION,
        'ACCURACY_GATE',
        '0',
      ]);
      expect(await versionIds('t')).toEqual(['1']);
      expect(storedArtifacts()).toEqual([sha256Of(buildTinyModel().bytes)]);
    });

    it('refuses a negative or non-finite gate with INVALID_ARGUMENT before any work', async () => {
      await register('m', '1');

      for (const maxRelativeL2 of [-0.5, Number.NaN, Number.POSITIVE_INFINITY]) {
        const error = await rpcRejection(quantize({ source: 'models/m/versions/1', maxRelativeL2 }));
        expect([error.code, error.message]).toEqual([
          status.INVALID_ARGUMENT,
          `max_relative_l2 must be a number 0 or more, got ${maxRelativeL2}`,
        ]);
      }
      expect(await versionIds('m')).toEqual(['1']);
    });
  });

  describe('running', () => {
    it('runs derivations one at a time: two at once of the same source become its next two versions', async () => {
      await register('m', '1');

      const [first, second] = await Promise.all([
        quantize({ source: 'models/m/versions/1' }),
        quantize({ source: 'models/m/versions/1' }),
      ]);

      expect([first.name, second.name]).toEqual(['models/m/versions/2', 'models/m/versions/3']);
    });

    it('refuses with RESOURCE_EXHAUSTED a derivation beyond REGISTRY_MAX_QUEUED_DERIVATIONS waiting, and runs the others', async () => {
      config = loadRegistryConfig({ REGISTRY_DATA_DIR: dir, REGISTRY_MAX_QUEUED_DERIVATIONS: '1' });
      metrics = new Metrics('registry');
      sut = new ModelDerivation(catalog, artifacts, new OnnxRuntime(), config, logger, metrics);
      await register('m', '1');

      const results = await Promise.allSettled([1, 2, 3].map(() => quantize({ source: 'models/m/versions/1' })));

      expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'rejected']);
      const error = (results[2] as PromiseRejectedResult).reason as { code: number; reason: string; message: string };
      expect([error.code, error.reason]).toEqual([status.RESOURCE_EXHAUSTED, 'OVERLOADED']);
      expect(error.message).toContain('REGISTRY_MAX_QUEUED_DERIVATIONS');
      expect(await versionIds('m')).toEqual(['1', '2', '3']);
      expect(await derivations('refused_busy')).toBe(1);
    });

    it('stops, registering nothing, when its caller has gone away', async () => {
      await register('m', '1');
      const caller = new AbortController();
      caller.abort();

      const error = await rpcRejection(
        sut.quantize(create(QuantizeModelVersionRequestSchema, { source: 'models/m/versions/1' }), caller.signal),
      );

      expect(error.code).toBe(status.CANCELLED);
      expect(await versionIds('m')).toEqual(['1']);
      expect(await derivations('cancelled')).toBe(1);
    });

    it('refuses a source above REGISTRY_MAX_DERIVATION_BYTES, and a target version that exists, before any work', async () => {
      await register('m', '1');
      await register('m', '2', buildTinyModel());
      const before = storedArtifacts();

      const exists = await rpcRejection(quantize({ source: 'models/m/versions/1', versionId: '2' }));
      expect([exists.code, exists.message]).toEqual([
        status.ALREADY_EXISTS,
        'models/m/versions/2 already exists; name another version or model',
      ]);

      config = loadRegistryConfig({ REGISTRY_DATA_DIR: dir, REGISTRY_MAX_DERIVATION_BYTES: '1KiB' });
      sut = new ModelDerivation(catalog, artifacts, new OnnxRuntime(), config, logger, new Metrics('registry'));
      const large = await rpcRejection(quantize({ source: 'models/m/versions/1' }));
      expect([large.code, large.reason]).toEqual([status.FAILED_PRECONDITION, 'NOT_QUANTIZABLE']);
      expect(large.message).toMatch(
        /^models\/m\/versions\/1 is \d+ bytes, above the 1024 the registry derives from \(REGISTRY_MAX_DERIVATION_BYTES/,
      );
      expect(storedArtifacts()).toEqual(before);
    });

    it('refuses with FAILED_PRECONDITION, asking for calibration samples, a model its synthetic inputs do not suit', async () => {
      // Random whole numbers up to 127 are indices out of range.
      const picker = pickerModel();
      await register('m', '1', picker, { maxBatchSize: 0 });

      const error = await rpcRejection(quantize({ source: 'models/m/versions/1' }));

      expect([error.code, error.reason]).toEqual([status.FAILED_PRECONDITION, 'NOT_QUANTIZABLE']);
      expect(error.message).toMatch(
        /^the source cannot run on calibration samples\[\d\] \("synthetic \d"\): .*; give calibration samples the model takes$/,
      );
    });
  });

  describe('version_derivations_total', () => {
    it('counts each derivation by its outcome', async () => {
      await register('m', '1');
      await register('q', '1', buildQuantizedFormModel('dynamic-quantize-linear'));
      expect(await derivations('registered')).toBe(0);

      await quantize({ source: 'models/m/versions/1' });
      await quantize({ source: 'models/m/versions/1' });
      await rpcRejection(quantize({ source: 'models/m/versions/1', maxRelativeL2: 1e-6 }));
      await rpcRejection(quantize({ source: 'models/q/versions/1' }));
      await rpcRejection(quantize({ source: 'models/m/versions/1', maxRelativeL2: -1 }));
      await rpcRejection(quantize({ source: 'models/none/versions/1' }));

      expect({
        registered: await derivations('registered'),
        refused_accuracy: await derivations('refused_accuracy'),
        not_quantizable: await derivations('not_quantizable'),
        invalid: await derivations('invalid'),
        error: await derivations('error'),
      }).toEqual({ registered: 2, refused_accuracy: 1, not_quantizable: 1, invalid: 2, error: 0 });
    });
  });
});
