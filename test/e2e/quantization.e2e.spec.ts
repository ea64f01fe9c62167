import { createClient } from '@infermesh/grpc';
import { relativeL2 } from '@infermesh/testing';
import { buildCnnModel, buildQuantizedFormModel, type BuiltModel, QUANTIZED_FORMS } from '@infermesh/model-builder';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type ModelVersion,
  RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import * as ort from 'onnxruntime-node';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { API_KEY, type Fixture, runCli, startFixture } from './support/system-fixture';

interface RestAnswer {
  status: number;
  model?: string;
  degraded?: boolean;
  output?: { shape: number[]; data: number[] };
  error?: string;
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) =>
  Math.max(...Array.from(a, (v, i) => Math.abs(v - b[i]!)));

/** Deterministic inputs in [-1, 1]. */
const wave = (count: number, phase = 0) =>
  Array.from({ length: count }, (_, i) => Math.fround(Math.sin(i * 0.37 + phase)));

/**
 * Quantized models as an ML engineer meets them: models already quantized in each of ONNX's forms,
 * registered with the CLI and served by six real services, their answers compared with
 * onnxruntime-node run in-process on the same bytes; and int8 variants derived from FP32 models by
 * `infermesh models quantize`, with their lineage and accuracy figures, the accuracy gate refusing
 * one, and a variant serving as its source's fallback.
 */
describe('quantized models', () => {
  let fixture: Fixture;
  let workDir: string;
  let registry: ReturnType<typeof createClient<typeof RegistryService>>;
  let worker: ReturnType<typeof createClient<typeof WorkerService>>;
  const cnn = buildCnnModel();

  const cli = (args: string[], timeoutMs = 120_000) => runCli(args, fixture.system.gatewayGrpcAddress, timeoutMs);
  const write = (file: string, content: Uint8Array | object) => {
    const path = join(workDir, file);
    writeFileSync(path, content instanceof Uint8Array ? content : JSON.stringify(content));
    return path;
  };
  const versionOf = async (model: string, id: string): Promise<ModelVersion> =>
    (await registry.getModel({ name: `models/${model}` })).model!.versions.find((v) =>
      v.name.endsWith(`/versions/${id}`),
    )!;
  const artifactOf = async (version: ModelVersion) => {
    const chunks: Uint8Array[] = [];
    for await (const { chunk } of registry.downloadArtifact({ sha256: version.artifact!.sha256 })) chunks.push(chunk);
    return new Uint8Array(Buffer.concat(chunks));
  };

  /** One request over REST to a model (a version when given); its first output as float32 values. */
  const infer = async (
    model: string,
    input: { name: string; shape: number[]; data: number[] },
    version?: string,
  ): Promise<RestAnswer> => {
    const path = version === undefined ? `/v2/models/${model}/infer` : `/v2/models/${model}/versions/${version}/infer`;
    const res = await fetch(`${fixture.system.gatewayUrl}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs: [{ ...input, datatype: 'FP32' }] }),
      signal: AbortSignal.timeout(30_000),
    });
    const body = (await res.json()) as {
      model_name?: string;
      parameters?: { degraded?: boolean };
      outputs?: { shape: number[]; data: number[] }[];
      error?: string;
    };
    if (res.status !== 200) return { status: res.status, error: body.error };
    const output = body.outputs![0]!;
    return {
      status: 200,
      model: body.model_name,
      degraded: body.parameters?.degraded,
      output: { shape: output.shape, data: output.data.map(Math.fround) },
    };
  };

  /** What onnxruntime-node answers in-process for the same bytes and input. */
  const direct = async (bytes: Uint8Array, input: { name: string; shape: number[]; data: number[] }) => {
    const session = await ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
    try {
      const out = await session.run({
        [input.name]: new ort.Tensor('float32', Float32Array.from(input.data), input.shape),
      });
      const first = out[session.outputNames[0]!]!;
      return { shape: [...first.dims], data: Array.from(first.data as Float32Array) };
    } finally {
      await session.release();
    }
  };

  beforeAll(async () => {
    workDir = mkdtempSync(join(tmpdir(), 'infermesh-quantization-'));
    fixture = await startFixture({ models: ['mlp', { ...cnn, name: 'cnn' }], env: { ROUTER_CACHE_ENABLED: 'false' } });
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    worker = createClient(WorkerService, fixture.system.grpcAddress('worker'));
  }, 120_000);

  afterAll(async () => {
    registry?.close();
    worker?.close();
    await fixture?.stop();
    rmSync(workDir, { recursive: true, force: true });
  });

  it.each(QUANTIZED_FORMS)(
    'serves a model in the %s form: registered READY with its signature read, batching, charged its memory, answering as onnxruntime-node does',
    async (form) => {
      const model: BuiltModel = buildQuantizedFormModel(form);
      const result = await cli(['models', 'register', write(`${model.name}.onnx`, model.bytes), '--name', model.name]);
      expect({ code: result.code, stderr: result.stderr }).toEqual({
        code: 0,
        stderr: expect.not.stringContaining('warning'),
      });

      const version = await versionOf(model.name, '1');
      expect(version.state).toBe(VersionState.READY);
      expect(version.signature!.inputs.map((s) => [s.name, s.datatype, s.shape.map(Number)])).toEqual([
        ['input', DataType.FP32, [-1, ...model.inputs[0]!.shape.slice(1)]],
      ]);
      expect(version.signature!.outputs.map((s) => [s.name, s.datatype, s.shape.map(Number)])).toEqual([
        ['output', DataType.FP32, [-1, ...model.outputs[0]!.shape.slice(1)]],
      ]);
      expect(version.signature!.maxBatchSize).toBeGreaterThan(0);
      const loaded = (await worker.listModels({})).models.find((m) => m.name === version.name);
      expect(Number(loaded?.memoryBytes)).toBeGreaterThan(0);

      const item = model.inputs[0]!.shape.slice(1).reduce((a, b) => a * b, 1);
      const input = {
        name: 'input',
        shape: [3, ...model.inputs[0]!.shape.slice(1)],
        data: wave(3 * item, QUANTIZED_FORMS.indexOf(form)),
      };
      const served = await infer(model.name, input);
      const expected = await direct(model.bytes, input);
      expect(served.status).toBe(200);
      expect(served.output!.shape).toEqual(expected.shape);
      expect(maxAbsDiff(expected.data, served.output!.data)).toBeLessThan(1e-5);
    },
  );

  it('derives an int8 variant of the demo MLP under another model, on one operator thread: READY, a quarter of the bytes, its lineage and figures recorded and shown, answering within the gate', async () => {
    const result = await cli(['models', 'quantize', 'mlp', '--as', 'mlp-int8', '--intra-op-threads', '1']);
    expect(result.code).toBe(0);
    expect(result.stderr).toMatch(
      /mlp-int8 version 1 derived from models\/mlp\/versions\/1: dynamic_int8, 3 nodes quantized, 0 kept in float; relative L2 0\.0\d+, max abs diff [\d.e-]+, top-1 agreement [\d.]+ % \(\d+ of 32\), 4 synthetic samples \(gate 0\.02\); artifact 6\.\d MiB/,
    );
    expect(result.stdout).toMatch(/^mlp-int8 version 1 is READY in /);

    const source = await versionOf('mlp', '1');
    const variant = await versionOf('mlp-int8', '1');
    expect(variant.state).toBe(VersionState.READY);
    expect(Number(variant.artifact!.sizeBytes) / Number(source.artifact!.sizeBytes)).toBeLessThan(0.3);
    expect(variant.signature).toEqual(source.signature);
    expect(variant.execution?.intraOpThreads).toBe(1);
    const lineage = variant.lineage!;
    expect(lineage).toMatchObject({
      sourceVersion: 'models/mlp/versions/1',
      sourceSha256: source.artifact!.sha256,
      method: 'dynamic_int8',
      settings: { perChannel: true, quantizeConv: false, reduceRange: true },
    });
    expect(lineage.quantizedNodes.map((n) => [n.node, n.opType, Number(n.elements)])).toEqual([
      ['fc0_matmul', 'MatMul', 512 * 2048],
      ['fc1_matmul', 'MatMul', 2048 * 2048],
      ['fc2_matmul', 'MatMul', 2048 * 512],
    ]);
    expect(lineage.accuracy).toMatchObject({ samples: 4, synthetic: true, comparedItems: 32, maxRelativeL2: 0.02 });
    expect(lineage.accuracy!.relativeL2).toBeGreaterThan(0);
    expect(lineage.accuracy!.relativeL2).toBeLessThanOrEqual(0.02);

    const show = await cli(['models', 'show', 'mlp-int8']);
    expect(show.stdout).toContain('Operator threads: 1 per instance');
    expect(show.stdout).toContain(`Derived from: models/mlp/versions/1 (sha256 ${source.artifact!.sha256})`);
    expect(show.stdout).toContain('Method: dynamic_int8, a scale per output channel, 7-bit weights, Conv in float');
    expect(show.stdout).toContain('Quantized: fc0_matmul (MatMul), fc1_matmul (MatMul), fc2_matmul (MatMul)');
    expect(show.stdout).toMatch(
      /Accuracy: relative L2 0\.0\d+, max abs diff .*, 4 synthetic samples; gate relative L2 0\.02/,
    );

    // It serves: the same answers as onnxruntime-node on the variant's own bytes, close to the FP32 source's.
    const input = { name: 'input', shape: [2, 512], data: wave(1024) };
    const served = await infer('mlp-int8', input);
    expect(maxAbsDiff((await direct(await artifactOf(variant), input)).data, served.output!.data)).toBeLessThan(1e-5);
    expect(relativeL2((await infer('mlp', input)).output!.data, served.output!.data)).toBeLessThan(0.02);
  });

  it('derives an int8 variant of a generated CNN as its next version, on calibration samples from a file: its dense layer quantized, its convolutions kept in float with the reason', async () => {
    const calibration = {
      samples: [
        {
          name: 'given',
          inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 3, 48, 192], data: wave(3 * 48 * 192) }],
        },
        { name: 'random', inputs: [{ name: 'input', shape: [3, 3, 48, 192], random_data: true }] },
      ],
    };
    const result = await cli([
      'models',
      'quantize',
      'cnn',
      '--version',
      '1',
      '--calibration',
      write('cnn-calibration.json', calibration),
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^cnn version 2 is READY in /);
    const variant = await versionOf('cnn', '2');
    expect(variant.state).toBe(VersionState.READY);
    // A variant registered as the next version takes over under the default policy (the latest
    // version serves): the FP32 source drains, as after any registration.
    expect([VersionState.DRAINING, VersionState.RETIRED]).toContain((await versionOf('cnn', '1')).state);
    const lineage = variant.lineage!;
    expect(lineage.quantizedNodes.map((n) => n.opType)).toEqual(['MatMul']);
    expect(lineage.floatNodes.map((n) => [n.opType, n.reason])).toEqual(
      Array.from({ length: 3 }, () => ['Conv', 'Conv is not among the operators asked for (MatMul, Gemm)']),
    );
    expect(lineage.accuracy).toMatchObject({ samples: 2, synthetic: false, comparedItems: 4 });
    expect(lineage.accuracy!.relativeL2).toBeLessThanOrEqual(0.02);

    // With --conv, every layer is quantized: a new model of a quarter of the bytes.
    const all = await cli([
      'models',
      'quantize',
      'cnn',
      '--version',
      '1',
      '--as',
      'cnn-int8',
      '--conv',
      '--max-rel-l2',
      '0.05',
    ]);
    expect(all.code).toBe(0);
    const small = await versionOf('cnn-int8', '1');
    expect(small.lineage!.quantizedNodes.map((n) => n.opType)).toEqual(['Conv', 'Conv', 'Conv', 'MatMul']);
    expect(Number(small.artifact!.sizeBytes) / Number((await versionOf('cnn', '1')).artifact!.sizeBytes)).toBeLessThan(
      0.35,
    );
    const input = { name: 'input', shape: [1, 3, 48, 192], data: wave(3 * 48 * 192, 1) };
    expect(
      maxAbsDiff((await direct(await artifactOf(small), input)).data, (await infer('cnn-int8', input)).output!.data),
    ).toBeLessThan(1e-5);
  });

  it('refuses a variant beyond --max-rel-l2 with its figures, registering nothing, and names what is wrong in bad requests', async () => {
    const refused = await cli(['models', 'quantize', 'mlp', '--as', 'mlp-strict', '--max-rel-l2', '0.0001']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /the int8 variant of models\/mlp\/versions\/1 is refused: its error is above the gate of relative L2 0\.0001 \(relative L2 0\.0\d+, max abs diff .*, 4 synthetic samples\); nothing was registered/,
    );
    await expect(registry.getModel({ name: 'models/mlp-strict' })).rejects.toMatchObject({ reason: 'MODEL_NOT_FOUND' });

    // Exit 1 for what the registry refuses, 2 for a usage error.
    const cases: [string[], number, RegExp][] = [
      [['models', 'quantize', 'nosuch'], 1, /model "nosuch" not found/],
      [['models', 'quantize', 'mlp', '--version', '9'], 1, /models\/mlp has no version 9/],
      [
        ['models', 'quantize', 'mlp', '--max-rel-l2', 'lots'],
        2,
        /--max-rel-l2 must be a number from 0 up, such as 0.02, got "lots"/,
      ],
      [
        [
          'models',
          'quantize',
          'mlp',
          '--as',
          'mlp-bad',
          '--calibration',
          write('bad.json', { inputs: [{ name: 'image', shape: [1, 512], random_data: true }] }),
        ],
        1,
        /calibration: samples\[0\]: the model has no input "image"; its inputs are "input"/,
      ],
    ];
    for (const [args, code, message] of cases) {
      const result = await cli(args);
      expect({ args, code: result.code, stderr: result.stderr }).toEqual({
        args,
        code,
        stderr: expect.stringMatching(message),
      });
    }
    const tiny = await cli([
      'models',
      'register',
      write('relu.onnx', buildQuantizedFormModel('dynamic-quantize-linear').bytes),
      '--name',
      'no-weights',
    ]);
    expect(tiny.code).toBe(0);
    const nothing = await cli(['models', 'quantize', 'no-weights', '--as', 'no-weights-int8']);
    expect(nothing.code).toBe(1);
    expect(nothing.stderr).toMatch(
      /models\/no-weights\/versions\/1 cannot be quantized: nothing to quantize: the model has no MatMul, Gemm node with a constant FP32 weight/,
    );
    // The registry still serves.
    expect((await infer('mlp', { name: 'input', shape: [1, 512], data: wave(512) })).status).toBe(200);
  });

  it("serves the variant as its source's fallback, marked degraded, while the source is unloaded", async () => {
    expect((await cli(['rollout', 'fallback', 'mlp', '--model', 'mlp-int8'])).code).toBe(0);
    expect((await cli(['models', 'unload', 'mlp'])).code).toBe(0);
    const input = { name: 'input', shape: [1, 512], data: wave(512, 2) };
    let answer: RestAnswer | undefined;
    for (let i = 0; i < 100; i++) {
      answer = await infer('mlp', input);
      if (answer.degraded === true) break;
      await sleep(100);
    }
    expect(answer).toMatchObject({ status: 200, degraded: true, model: 'mlp-int8' });
    const variant = await artifactOf(await versionOf('mlp-int8', '1'));
    expect(maxAbsDiff((await direct(variant, input)).data, answer!.output!.data)).toBeLessThan(1e-5);
    expect((await cli(['models', 'load', 'mlp'])).code).toBe(0);
  });
});
