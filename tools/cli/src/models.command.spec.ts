import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { create, type MessageInitShape, toJson } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  type CreateModelVersionRequest,
  type DeleteModelRequest,
  type LineageSchema,
  ModelVersionSchema,
  type QuantizeModelVersionRequest,
  QuantizeModelVersionRequestSchema,
  type RetireModelVersionRequest,
  type UpdateModelRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type CaptureOptions, runCapturing } from './testing/cli-runner';
import { type FakeRegistry, ManualClock } from '@infermesh/testing';
import { type FakeGateway, startFakeGateway } from './testing/fake-gateway';
import { MODELS_GROUP } from './models.command';

const API_KEY = 'admin-key-0123456789abcdef';
const MiB = 1024 * 1024;

/** The lineage of an int8 variant of mlp version 1, as the registry records it. */
const LINEAGE: MessageInitShape<typeof LineageSchema> = {
  sourceVersion: 'models/mlp/versions/1',
  sourceSha256: 'ab'.repeat(32),
  method: 'dynamic_int8',
  settings: { perChannel: false, quantizeConv: true, reduceRange: false },
  quantizedNodes: [
    { node: 'fc1', opType: 'MatMul', weight: 'fc1.weight', elements: 4096n },
    { node: 'fc2', opType: 'Gemm', weight: 'fc2.weight', elements: 1024n },
    { node: 'stem', opType: 'Conv', weight: 'stem.weight', elements: 432n },
  ],
  floatNodes: [{ node: 'proj', opType: 'MatMul', reason: 'its weight is computed, not a constant initializer' }],
  accuracy: {
    samples: 4,
    synthetic: true,
    maxAbsDiff: 0.00312,
    relativeL2: 0.0108,
    comparedItems: 32,
    agreedItems: 31,
    maxRelativeL2: 0.05,
  },
};

describe(`infermesh ${MODELS_GROUP.name}`, () => {
  let running: FakeGateway;
  let registry: FakeRegistry;
  let dir: string;

  beforeEach(async () => {
    running = await startFakeGateway(API_KEY);
    registry = running.registry;
    dir = mkdtempSync(join(tmpdir(), 'infermesh-cli-'));
  });

  afterEach(async () => {
    await running.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const sut = (argv: string[], options: CaptureOptions = {}) =>
    runCapturing(argv, { INFERMESH_GATEWAY: running.address, INFERMESH_API_KEY: API_KEY }, options);

  function modelFile(bytes: number): { path: string; bytes: Buffer; sha256: string } {
    const content = randomBytes(bytes);
    const path = join(dir, 'model.onnx');
    writeFileSync(path, content);
    return { path, bytes: content, sha256: createHash('sha256').update(content).digest('hex') };
  }

  /** Once the CLI follows the registry, the version goes through `states`, as a worker reports them. */
  function loadsThrough(versionName: string, ...states: [VersionState, string?][]): void {
    registry.afterSnapshot = (r) => {
      for (const [state, reason] of states) r.setVersionState(versionName, state, reason);
    };
  }

  describe('register', () => {
    it('streams the file in chunks of at most 1 MiB with its sha256, registers it, and exits 0 once the version is READY', async () => {
      const file = modelFile(2.5 * MiB);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp']);

      expect(run.stderr).toContain('Uploading model.onnx: 100% (2.5 MiB of 2.5 MiB');
      expect(run).toMatchObject({ code: 0 });
      expect(file.bytes.equals(registry.artifacts.get(file.sha256) ?? Buffer.alloc(0))).toBe(true);
      expect(registry.uploads).toEqual([{ chunkSizes: [MiB, MiB, 0.5 * MiB], expectedSha256: [file.sha256] }]);
      const [create] = registry.requests<CreateModelVersionRequest>('createModelVersion');
      expect(create).toMatchObject({ parent: 'models/mlp', versionId: '1', artifactSha256: file.sha256 });
      expect(create?.maxBatchSize).toBeUndefined();
      expect(run.stderr).toContain(`Registered mlp version 1 (sha256 ${file.sha256}, 2.5 MiB)\n`);
      expect(run.stderr).toContain('mlp version 1: REGISTERED\nmlp version 1: LOADING\nmlp version 1: READY\n');
      expect(run.stdout).toMatch(
        /^mlp version 1 is READY in \d+\.\d s \(upload \d+\.\d s, registration and loading \d+\.\d s\)\n$/,
      );
      expect(registry.requests('updateModel')).toEqual([]);
      expect(new Set(registry.calls.map((c) => c.authorization))).toEqual(new Set([`Bearer ${API_KEY}`]));
    });

    it("numbers the version one above the model's highest, overrides the max batch size, pins the model and adds labels", async () => {
      registry.put({
        name: 'models/mlp',
        labels: { team: 'a', owner: 'ml' },
        versions: [
          { name: 'models/mlp/versions/2', state: VersionState.READY },
          { name: 'models/mlp/versions/10', state: VersionState.RETIRED },
        ],
      });
      const file = modelFile(100);
      loadsThrough('models/mlp/versions/11', [VersionState.READY]);

      const run = await sut([
        'models',
        'register',
        file.path,
        '--name',
        'mlp',
        '--max-batch-size',
        '4',
        '--pin',
        '--label',
        'team=b',
        '--label',
        'task=cls',
        '--intra-op-threads',
        '1',
      ]);

      expect(run).toMatchObject({ code: 0, stdout: expect.stringMatching(/^mlp version 11 is READY/) });
      expect(registry.requests<CreateModelVersionRequest>('createModelVersion')).toMatchObject([
        { versionId: '11', maxBatchSize: 4, execution: { intraOpThreads: 1 } },
      ]);
      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([
        {
          model: { name: 'models/mlp', pinned: true, labels: { team: 'b', owner: 'ml', task: 'cls' } },
          updateMask: { paths: ['pinned', 'labels'] },
        },
      ]);
      expect(registry.models.get('models/mlp')).toMatchObject({
        pinned: true,
        labels: { team: 'b', owner: 'ml', task: 'cls' },
      });
    });

    it('registers the version given with --version', async () => {
      const file = modelFile(10);
      loadsThrough('models/mlp/versions/5', [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--version', '5']);

      expect(run.code).toBe(0);
      expect(registry.requests<CreateModelVersionRequest>('createModelVersion')).toMatchObject([{ versionId: '5' }]);
      expect(registry.requests<CreateModelVersionRequest>('createModelVersion')[0]!.execution).toBeUndefined();
    });

    it('prints the reason and exits 1 when the version FAILED', async () => {
      const file = modelFile(10);
      loadsThrough(
        'models/mlp/versions/1',
        [VersionState.LOADING],
        [VersionState.FAILED, 'onnxruntime: invalid graph'],
      );

      const run = await sut(['models', 'register', file.path, '--name', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'mlp version 1: FAILED\ninfermesh: mlp version 1 FAILED: onnxruntime: invalid graph\n',
      );
      expect(run.stdout).toBe('');
    });

    it('exits 1 with a message when the version is not READY within --timeout', async () => {
      const file = modelFile(10);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING]);
      // The half second passes on the CLI's clock once it has shown the version LOADING, not before.
      const clock = new ManualClock();
      const onStderr = (text: string) => {
        if (text.includes('mlp version 1: LOADING')) clock.advance(500);
      };

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--timeout', '0.5'], {
        clock,
        onStderr,
      });

      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'infermesh: mlp version 1 is not READY after 0.5 s (still LOADING); it may still load: follow it with `infermesh models show mlp`\n',
      );
    });

    it('exits 1 without waiting when the model is unloaded', async () => {
      registry.put({
        name: 'models/mlp',
        unloaded: true,
        versions: [{ name: 'models/mlp/versions/1', state: VersionState.REGISTERED }],
      });
      const file = modelFile(10);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'infermesh: model mlp is unloaded, so mlp version 2 does not load: run `infermesh models load mlp`\n',
      );
    });

    it('prints only the READY version as protobuf JSON with --json', async () => {
      const file = modelFile(3 * MiB);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--json']);

      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(JSON.parse(run.stdout)).toMatchObject({
        name: 'models/mlp/versions/1',
        state: 'VERSION_STATE_READY',
        artifact: { sha256: file.sha256, sizeBytes: String(3 * MiB), format: 'onnx' },
      });
    });

    it('draws a progress bar and one line of states on a terminal', async () => {
      const file = modelFile(2 * MiB);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp'], { tty: true });

      expect(run.code).toBe(0);
      expect(run.stderr).toContain('\rUploading model.onnx [##############################] 100% (2.0 MiB of 2.0 MiB');
      expect(run.stderr).toContain('mlp version 1: REGISTERED → LOADING → READY\n');
    });

    it('sends the samples of --warmup with the registration, and warns when the version serves without warm-up', async () => {
      const file = modelFile(10);
      const warmUpFile = join(dir, 'samples.json');
      writeFileSync(
        warmUpFile,
        JSON.stringify({
          inputs: [
            { name: 'audio', datatype: 'FP32', shape: [1, 2], data: [[0.5, -1]] },
            { name: 'sr', shape: [1], random_data: true },
          ],
        }),
      );
      loadsThrough('models/vad/versions/1', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'vad', '--warmup', warmUpFile]);

      expect(run.code).toBe(0);
      const [request] = registry.requests<CreateModelVersionRequest>('createModelVersion');
      expect(request!.warmUp!.samples[0]!.inputs.map((i) => [i.name, i.datatype, i.shape, i.contents.case])).toEqual([
        ['audio', DataType.FP32, [1n, 2n], 'data'],
        ['sr', DataType.UNSPECIFIED, [1n], 'randomData'],
      ]);
      expect(request!.warmUp!.samples[0]!.inputs[0]!.contents.value).toEqual(
        new Uint8Array(Float32Array.of(0.5, -1).buffer),
      );
      expect(run.stderr).not.toContain('warning');

      registry.afterSnapshot = (r) =>
        r.setVersionState(
          'models/cold/versions/1',
          VersionState.READY,
          '',
          'synthetic warm-up at batch 1 failed on cpu: Pad reflect',
        );
      const cold = await sut(['models', 'register', file.path, '--name', 'cold']);
      expect(cold.code).toBe(0);
      expect(cold.stderr).toContain(
        'warning: cold version 1 serves without warm-up: synthetic warm-up at batch 1 failed on cpu: Pad reflect\n',
      );
      expect(cold.stdout).toMatch(/^cold version 1 is READY \(not warmed up\) in /);
    });

    it('exits 1 before calling the gateway when the --warmup file is wrong, naming the file and the entry', async () => {
      const file = modelFile(10);
      const warmUpFile = join(dir, 'samples.json');
      writeFileSync(
        warmUpFile,
        JSON.stringify({ inputs: [{ name: 'sr', datatype: 'INT64', shape: [1], data: [16000.5] }] }),
      );

      const run = await sut(['models', 'register', file.path, '--name', 'vad', '--warmup', warmUpFile]);

      expect(run.code).toBe(1);
      expect(run.stderr).toBe(
        `infermesh: --warmup ${warmUpFile}: inputs[0]: input "sr": element 0 (16000.5) is not an integer in the INT64 range\n`,
      );
      expect(registry.calls).toEqual([]);
    });

    it('exits 1 before calling the gateway when the file cannot be read', async () => {
      const run = await sut(['models', 'register', join(dir, 'missing.onnx'), '--name', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toBe(`infermesh: cannot read ${join(dir, 'missing.onnx')}: no such file\n`);
      expect(registry.calls).toEqual([]);
    });

    it('refuses a malformed --version or --label with exit 2 and the usage', async () => {
      const file = modelFile(10);

      const badVersion = await sut(['models', 'register', file.path, '--name', 'mlp', '--version', 'v1']);
      const badLabel = await sut(['models', 'register', file.path, '--name', 'mlp', '--label', 'team']);

      expect(badVersion.code).toBe(2);
      expect(badVersion.stderr).toMatch(
        /^infermesh: --version must be a positive integer version id, got "v1"\n\nUsage: infermesh models register <file.onnx> --name <name> \[flags\]/,
      );
      expect(badLabel.code).toBe(2);
      expect(badLabel.stderr).toMatch(/^infermesh: --label must look like key=value, got "team"\n/);
      const badThreads = await sut(['models', 'register', file.path, '--name', 'mlp', '--intra-op-threads', '0']);
      expect(badThreads.code).toBe(2);
      expect(badThreads.stderr).toMatch(/^infermesh: --intra-op-threads must be an integer of at least 1, got "0"\n/);
      expect(registry.calls).toEqual([]);
    });
  });

  describe('quantize', () => {
    beforeEach(() => {
      registry.put({
        name: 'models/mlp',
        versions: [
          {
            name: 'models/mlp/versions/1',
            state: VersionState.READY,
            artifact: { sha256: 'ab'.repeat(32), sizeBytes: BigInt(20 * MiB), format: 'onnx' },
          },
        ],
      });
    });

    /**
     * The registry derives `versionName` (REGISTERED, with `lineage` and an artifact of `sizeBytes`) and
     * adds it to its model, created when new, as the real registry does before it answers.
     */
    function derives(versionName: string, lineage: MessageInitShape<typeof LineageSchema>, sizeBytes: number): void {
      registry.handlers.quantizeModelVersion = async () => {
        const version = create(ModelVersionSchema, {
          name: versionName,
          state: VersionState.REGISTERED,
          artifact: { sha256: 'cd'.repeat(32), sizeBytes: BigInt(sizeBytes), format: 'onnx' },
          lineage,
        });
        const modelName = versionName.slice(0, versionName.indexOf('/versions/'));
        (registry.models.get(modelName) ?? registry.put({ name: modelName })).versions.push(version);
        return { version };
      };
    }

    const quantizeRequest = () => {
      const requests = registry.requests<QuantizeModelVersionRequest>('quantizeModelVersion');
      expect(requests).toHaveLength(1);
      return requests[0]!;
    };

    it('sends every flag, prints the figures of the variant, and exits 0 once it is READY', async () => {
      const calibration = join(dir, 'calibration.json');
      writeFileSync(
        calibration,
        JSON.stringify({
          samples: [
            { name: 'real', inputs: [{ name: 'x', datatype: 'FP32', shape: [1, 2], data: [[0.25, -2]] }] },
            { inputs: [{ name: 'x', shape: [4, 2], random_data: true }] },
          ],
        }),
      );
      derives('models/mlp_int8/versions/3', LINEAGE, 6 * MiB);
      loadsThrough('models/mlp_int8/versions/3', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut([
        'models',
        'quantize',
        'mlp',
        '--version',
        '1',
        '--as',
        'mlp_int8',
        '--new-version',
        '3',
        '--calibration',
        calibration,
        '--max-rel-l2',
        '0.05',
        '--per-tensor',
        '--conv',
        '--full-range',
        '--intra-op-threads',
        '1',
      ]);

      expect(run.code).toBe(0);
      const request = quantizeRequest();
      expect(toJson(QuantizeModelVersionRequestSchema, request)).toEqual({
        source: 'models/mlp/versions/1',
        targetModel: 'models/mlp_int8',
        versionId: '3',
        calibration: expect.any(Array),
        maxRelativeL2: 0.05,
        settings: { perChannel: false, quantizeConv: true, reduceRange: false },
        execution: { intraOpThreads: 1 },
      });
      expect(
        request.calibration.map((s) => [s.name, s.inputs.map((i) => [i.name, i.datatype, i.shape, i.contents.case])]),
      ).toEqual([
        ['real', [['x', DataType.FP32, [1n, 2n], 'data']]],
        ['', [['x', DataType.UNSPECIFIED, [4n, 2n], 'randomData']]],
      ]);
      expect(request.calibration[0]!.inputs[0]!.contents.value).toEqual(
        new Uint8Array(Float32Array.of(0.25, -2).buffer),
      );
      expect(run.stderr).toBe(
        'mlp_int8 version 3 derived from models/mlp/versions/1: dynamic_int8, 3 nodes quantized, 1 kept in float; relative L2 0.0108, ' +
          'max abs diff 0.00312, top-1 agreement 96.9 % (31 of 32), 4 synthetic samples (gate 0.05); artifact 6.0 MiB\n' +
          'mlp_int8 version 3: REGISTERED\nmlp_int8 version 3: LOADING\nmlp_int8 version 3: READY\n',
      );
      expect(run.stdout).toMatch(/^mlp_int8 version 3 is READY in \d+\.\d s\n$/);
      expect(new Set(registry.calls.map((c) => c.authorization))).toEqual(new Set([`Bearer ${API_KEY}`]));
    });

    it("asks for a variant of the serving version under the same model, with the registry's defaults, when no flag is given", async () => {
      derives(
        'models/mlp/versions/2',
        {
          ...LINEAGE,
          quantizedNodes: LINEAGE.quantizedNodes!.slice(0, 1),
          floatNodes: [],
          accuracy: { samples: 1, maxAbsDiff: 0.0123, relativeL2: 0.00451, maxRelativeL2: 0.02 },
        },
        512 * 1024,
      );
      loadsThrough('models/mlp/versions/2', [VersionState.READY]);

      const run = await sut(['models', 'quantize', 'mlp']);

      expect(run.code).toBe(0);
      const request = quantizeRequest();
      expect(toJson(QuantizeModelVersionRequestSchema, request)).toEqual({ source: 'models/mlp', settings: {} });
      expect([request.targetModel, request.versionId, request.calibration, request.maxRelativeL2]).toEqual([
        '',
        '',
        [],
        undefined,
      ]);
      expect([request.settings?.perChannel, request.settings?.quantizeConv]).toEqual([undefined, undefined]);
      expect(run.stderr).toContain(
        'mlp version 2 derived from models/mlp/versions/1: dynamic_int8, 1 node quantized, 0 kept in float; relative L2 0.00451, max abs diff 0.0123, 1 sample (gate 0.02); artifact 512.0 KiB\n',
      );
      expect(run.stdout).toMatch(/^mlp version 2 is READY in \d+\.\d s\n$/);
    });

    it('prints only the READY variant, with its lineage, as protobuf JSON with --json', async () => {
      derives('models/mlp/versions/2', LINEAGE, 6 * MiB);
      loadsThrough('models/mlp/versions/2', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'quantize', 'mlp', '--json']);

      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(JSON.parse(run.stdout)).toMatchObject({
        name: 'models/mlp/versions/2',
        state: 'VERSION_STATE_READY',
        artifact: { sizeBytes: String(6 * MiB) },
        lineage: {
          sourceVersion: 'models/mlp/versions/1',
          method: 'dynamic_int8',
          settings: { perChannel: false, quantizeConv: true },
          floatNodes: [{ node: 'proj', opType: 'MatMul' }],
          accuracy: { relativeL2: 0.0108, maxRelativeL2: 0.05, samples: 4, synthetic: true },
        },
      });
    });

    it('exits 1 with the reason when the variant FAILED to load', async () => {
      derives('models/mlp/versions/2', LINEAGE, MiB);
      loadsThrough(
        'models/mlp/versions/2',
        [VersionState.LOADING],
        [VersionState.FAILED, 'onnxruntime: MatMulInteger is not supported'],
      );

      const run = await sut(['models', 'quantize', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain('infermesh: mlp version 2 FAILED: onnxruntime: MatMulInteger is not supported\n');
      expect(run.stdout).toBe('');
    });

    it.each([
      [['--max-rel-l2', 'abc'], '--max-rel-l2 must be a number from 0 up, such as 0.02, got "abc"'],
      [['--max-rel-l2', '-1'], '--max-rel-l2 must be a number from 0 up, such as 0.02, got "-1"'],
      [['--max-rel-l2', ''], '--max-rel-l2 must be a number from 0 up, such as 0.02, got ""'],
      [['--version', 'x'], '--version must be a positive integer version id, got "x"'],
      [['--new-version', '0'], '--new-version must be a positive integer version id, got "0"'],
      [['--timeout', '0'], '--timeout must be a number of seconds above 0, got "0"'],
    ])('refuses %j with exit 2 and the usage, asking the registry nothing', async (flags, message) => {
      registry.handlers.quantizeModelVersion = async () => {
        throw new Error('the registry was asked');
      };

      const run = await sut(['models', 'quantize', 'mlp', ...flags]);

      expect(run.code).toBe(2);
      expect(run.stderr.startsWith(`infermesh: ${message}\n\nUsage: infermesh models quantize <name> [flags]`)).toBe(
        true,
      );
      expect(registry.calls).toEqual([]);
    });

    it.each([
      [
        'a wrong shape',
        { inputs: [{ name: 'x', datatype: 'FP32', shape: [1, -2], data: [0.5] }] },
        (file: string) => `--calibration ${file}: inputs[0] ("x"): "shape" must be an array of sizes`,
      ],
      [
        'data that does not fit its shape',
        { inputs: [{ name: 'x', datatype: 'FP32', shape: [1, 3], data: [0.5, 1] }] },
        (file: string) => `--calibration ${file}: inputs[0]: input "x"`,
      ],
      ['malformed JSON', '{"inputs": [', (file: string) => `--calibration ${file} is not JSON: `],
    ])(
      'exits 1 before calling the gateway when the --calibration file has %s, with the message of the warm-up file reader',
      async (_what, content, message) => {
        const calibration = join(dir, 'calibration.json');
        writeFileSync(calibration, typeof content === 'string' ? content : JSON.stringify(content));

        const run = await sut(['models', 'quantize', 'mlp', '--calibration', calibration]);

        expect(run.code).toBe(1);
        expect(run.stderr).toMatch(/^infermesh: /);
        expect(run.stderr).toContain(message(calibration));
        expect(run.stdout).toBe('');
        expect(registry.calls).toEqual([]);
      },
    );

    it("exits 1 with the registry's message when it refuses the variant", async () => {
      const refusal =
        'the int8 variant of models/mlp/versions/1 is off by relative L2 0.0712 on 4 synthetic samples, above the gate 0.02; nothing was registered';
      registry.handlers.quantizeModelVersion = async () => {
        throw Errors.accuracyGate(refusal);
      };

      const run = await sut(['models', 'quantize', 'mlp', '--version', '1']);

      expect(run).toEqual({ code: 1, stdout: '', stderr: `infermesh: ${refusal} (FAILED_PRECONDITION)\n` });
      expect(quantizeRequest().source).toBe('models/mlp/versions/1');
      expect(registry.requests('watchModels')).toEqual([]);
    });
  });

  describe('list and show', () => {
    beforeEach(() => {
      registry.put({
        name: 'models/mlp',
        pinned: true,
        versions: [
          { name: 'models/mlp/versions/1', state: VersionState.READY },
          { name: 'models/mlp/versions/2', state: VersionState.LOADING, execution: { intraOpThreads: 1 } },
        ],
      });
      registry.put({
        name: 'models/tiny',
        unloaded: true,
        versions: [{ name: 'models/tiny/versions/1', state: VersionState.REGISTERED }],
      });
    });

    it('lists the models as a table', async () => {
      const run = await sut(['models', 'list']);

      expect(run).toEqual({
        code: 0,
        stderr: '',
        stdout: [
          'NAME  VERSIONS            SERVING  PINNED  UNLOADED',
          'mlp   1 READY, 2 LOADING  1        yes     no',
          'tiny  1 REGISTERED        -        no      yes',
          '',
        ].join('\n'),
      });
    });

    it('lists the models as protobuf JSON with --json', async () => {
      const run = await sut(['models', 'list', '--json']);

      expect(JSON.parse(run.stdout)).toMatchObject({
        models: [
          {
            name: 'models/mlp',
            pinned: true,
            versions: [{ state: 'VERSION_STATE_READY' }, { state: 'VERSION_STATE_LOADING' }],
          },
          { name: 'models/tiny', unloaded: true },
        ],
      });
    });

    it('shows one model', async () => {
      const run = await sut(['models', 'show', 'tiny']);

      expect(run.code).toBe(0);
      expect(run.stdout).toContain('Model:           tiny\n');
      expect(run.stdout).toContain('Unloaded:        yes (no version serves until `infermesh models load`)\n');
      expect(run.stdout).toContain('Version 1: REGISTERED\n');
      expect(run.stdout).toContain("  Operator threads: the worker's default\n");
      expect(registry.requests('getModel')).toMatchObject([{ name: 'models/tiny' }]);
      const mlp = await sut(['models', 'show', 'mlp']);
      expect(mlp.stdout).toMatch(/Version 2: LOADING\n[^]*  Operator threads: 1 per instance\n/);
    });

    it('shows the lineage of a derived version, and none for a version that was uploaded', async () => {
      registry.put({
        name: 'models/mlp_int8',
        versions: [
          { name: 'models/mlp_int8/versions/1', state: VersionState.READY },
          { name: 'models/mlp_int8/versions/2', state: VersionState.READY, lineage: LINEAGE },
        ],
      });

      const run = await sut(['models', 'show', 'mlp_int8']);

      expect(run.code).toBe(0);
      const [uploaded, derived] = run.stdout.split(/^Version \d+: /m).slice(1);
      expect(uploaded).not.toContain('Derived from');
      expect(derived).toContain(
        [
          `  Derived from: models/mlp/versions/1 (sha256 ${'ab'.repeat(32)})`,
          '  Method: dynamic_int8, one scale per weight, 8-bit weights, Conv quantized',
          '  Quantized: fc1 (MatMul), fc2 (Gemm), stem (Conv)',
          '  Kept in float:',
          '    proj (MatMul): its weight is computed, not a constant initializer',
          '  Accuracy: relative L2 0.0108, max abs diff 0.00312, top-1 agreement 96.9 % (31 of 32), 4 synthetic samples; gate relative L2 0.05',
        ].join('\n'),
      );
    });

    it('shows the default quantization settings of a lineage that leaves them unset', async () => {
      registry.put({
        name: 'models/mlp_int8',
        versions: [
          {
            name: 'models/mlp_int8/versions/1',
            state: VersionState.READY,
            lineage: { ...LINEAGE, settings: {}, quantizedNodes: [], floatNodes: [] },
          },
        ],
      });

      const run = await sut(['models', 'show', 'mlp_int8']);

      expect(run.stdout).toContain(
        '  Method: dynamic_int8, a scale per output channel, 7-bit weights, Conv in float\n  Quantized: none\n  Accuracy: ',
      );
      expect(run.stdout).not.toContain('Kept in float');
    });

    it("prints the gateway's error with its code and exits 1 for a model that does not exist", async () => {
      const run = await sut(['models', 'show', 'nope']);

      expect(run).toEqual({ code: 1, stdout: '', stderr: 'infermesh: model "nope" not found (NOT_FOUND)\n' });
    });
  });

  describe('load, unload, retire, delete and set-policy', () => {
    beforeEach(() => {
      registry.put({ name: 'models/mlp', versions: [{ name: 'models/mlp/versions/1', state: VersionState.READY }] });
    });

    it('unloads and loads a model with UpdateModel on "unloaded"', async () => {
      const unload = await sut(['models', 'unload', 'mlp']);
      const unloaded = registry.models.get('models/mlp')?.unloaded;
      const load = await sut(['models', 'load', 'mlp']);

      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([
        { model: { name: 'models/mlp', unloaded: true }, updateMask: { paths: ['unloaded'] } },
        { model: { name: 'models/mlp', unloaded: false }, updateMask: { paths: ['unloaded'] } },
      ]);
      expect(unloaded).toBe(true);
      expect(registry.models.get('models/mlp')?.unloaded).toBe(false);
      expect(unload).toMatchObject({
        code: 0,
        stdout: 'mlp is unloaded: its versions drain and stop serving; `infermesh models load mlp` loads it again.\n',
      });
      expect(load).toMatchObject({
        code: 0,
        stdout:
          'mlp loads the versions its policy selects (latest 1 (default)); follow them with `infermesh models show mlp`.\n',
      });
    });

    it('retires a version', async () => {
      const run = await sut(['models', 'retire', 'mlp', '--version', '1']);

      expect(registry.requests<RetireModelVersionRequest>('retireModelVersion')).toMatchObject([
        { name: 'models/mlp/versions/1' },
      ]);
      expect(run).toEqual({ code: 0, stderr: '', stdout: 'mlp version 1: DRAINING\n' });
    });

    it('deletes a model', async () => {
      const run = await sut(['models', 'delete', 'mlp', '--json']);

      expect(registry.requests<DeleteModelRequest>('deleteModel')).toMatchObject([{ name: 'models/mlp' }]);
      expect(registry.models.get('models/mlp')).toBeUndefined();
      expect(run).toEqual({ code: 0, stderr: '', stdout: '{}\n' });
    });

    it.each([
      [['--latest', '2'], { policy: { case: 'latest', value: 2 } }, 'latest 2'],
      [['--specific', '1,3'], { policy: { case: 'specific', value: { versions: ['1', '3'] } } }, 'specific 1, 3'],
      [['--all'], { policy: { case: 'all', value: {} } }, 'all'],
    ])('sets the version policy %j', async (flags, versionPolicy, text) => {
      const run = await sut(['models', 'set-policy', 'mlp', ...flags]);

      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([
        { model: { name: 'models/mlp', versionPolicy }, updateMask: { paths: ['version_policy'] } },
      ]);
      expect(run).toEqual({ code: 0, stderr: '', stdout: `mlp: version policy ${text}\n` });
    });

    it.each([
      [[], 'give one of --latest <n>, --specific <ids> or --all'],
      [['--latest', '1', '--all'], 'give only one of --latest, --all'],
      [['--specific', '1,x'], '--specific must be a positive integer version id, got "x"'],
    ])('refuses set-policy %j with exit 2 and the usage', async (flags, message) => {
      const run = await sut(['models', 'set-policy', 'mlp', ...flags]);

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        new RegExp(
          `^infermesh: ${message.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\n\nUsage: infermesh models set-policy <name> \\[flags\\]`,
        ),
      );
      expect(registry.requests('updateModel')).toEqual([]);
    });
  });
});
