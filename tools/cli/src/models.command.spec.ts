import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type CreateModelVersionRequest,
  type DeleteModelRequest,
  type RetireModelVersionRequest,
  type UpdateModelRequest,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { runCapturing } from './testing/cli-runner';
import { type FakeRegistry, type RunningFakeRegistry, startFakeRegistry } from './testing/fake-registry';
import { MODELS_GROUP } from './models.command';

const API_KEY = 'admin-key-0123456789abcdef';
const MiB = 1024 * 1024;

describe(`infermesh ${MODELS_GROUP.name}`, () => {
  let running: RunningFakeRegistry;
  let registry: FakeRegistry;
  let dir: string;

  beforeEach(async () => {
    running = await startFakeRegistry(API_KEY);
    registry = running.registry;
    dir = mkdtempSync(join(tmpdir(), 'infermesh-cli-'));
  });

  afterEach(async () => {
    await running.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const sut = (argv: string[], options: { tty?: boolean } = {}) =>
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
      expect(run.stdout).toMatch(/^mlp version 1 is READY in \d+\.\d s \(upload \d+\.\d s, registration and loading \d+\.\d s\)\n$/);
      expect(registry.requests('updateModel')).toEqual([]);
      expect(new Set(registry.calls.map((c) => c.authorization))).toEqual(new Set([`Bearer ${API_KEY}`]));
    });

    it("numbers the version one above the model's highest, overrides the max batch size, pins the model and adds labels", async () => {
      registry.seed({
        name: 'models/mlp',
        labels: { team: 'a', owner: 'ml' },
        versions: [
          { name: 'models/mlp/versions/2', state: VersionState.READY },
          { name: 'models/mlp/versions/10', state: VersionState.RETIRED },
        ],
      });
      const file = modelFile(100);
      loadsThrough('models/mlp/versions/11', [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--max-batch-size', '4', '--pin', '--label', 'team=b', '--label', 'task=cls']);

      expect(run).toMatchObject({ code: 0, stdout: expect.stringMatching(/^mlp version 11 is READY/) });
      expect(registry.requests<CreateModelVersionRequest>('createModelVersion')).toMatchObject([{ versionId: '11', maxBatchSize: 4 }]);
      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([
        { model: { name: 'models/mlp', pinned: true, labels: { team: 'b', owner: 'ml', task: 'cls' } }, updateMask: { paths: ['pinned', 'labels'] } },
      ]);
      expect(registry.model('models/mlp')).toMatchObject({ pinned: true, labels: { team: 'b', owner: 'ml', task: 'cls' } });
    });

    it('registers the version given with --version', async () => {
      const file = modelFile(10);
      loadsThrough('models/mlp/versions/5', [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--version', '5']);

      expect(run.code).toBe(0);
      expect(registry.requests<CreateModelVersionRequest>('createModelVersion')).toMatchObject([{ versionId: '5' }]);
    });

    it('prints the reason and exits 1 when the version FAILED', async () => {
      const file = modelFile(10);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING], [VersionState.FAILED, 'onnxruntime: invalid graph']);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain('mlp version 1: FAILED\ninfermesh: mlp version 1 FAILED: onnxruntime: invalid graph\n');
      expect(run.stdout).toBe('');
    });

    it('exits 1 with a message when the version is not READY within --timeout', async () => {
      const file = modelFile(10);
      loadsThrough('models/mlp/versions/1', [VersionState.LOADING]);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp', '--timeout', '0.5']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'infermesh: mlp version 1 is not READY after 0.5 s (still LOADING); it may still load: follow it with `infermesh models show mlp`\n',
      );
    });

    it('exits 1 without waiting when the model is unloaded', async () => {
      registry.seed({ name: 'models/mlp', unloaded: true, versions: [{ name: 'models/mlp/versions/1', state: VersionState.REGISTERED }] });
      const file = modelFile(10);

      const run = await sut(['models', 'register', file.path, '--name', 'mlp']);

      expect(run.code).toBe(1);
      expect(run.stderr).toContain('infermesh: model mlp is unloaded, so mlp version 2 does not load: run `infermesh models load mlp`\n');
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
        JSON.stringify({ inputs: [{ name: 'audio', datatype: 'FP32', shape: [1, 2], data: [[0.5, -1]] }, { name: 'sr', shape: [1], random_data: true }] }),
      );
      loadsThrough('models/vad/versions/1', [VersionState.LOADING], [VersionState.READY]);

      const run = await sut(['models', 'register', file.path, '--name', 'vad', '--warmup', warmUpFile]);

      expect(run.code).toBe(0);
      const [request] = registry.requests<CreateModelVersionRequest>('createModelVersion');
      expect(request!.warmUp!.samples[0]!.inputs.map((i) => [i.name, i.datatype, i.shape, i.contents.case])).toEqual([
        ['audio', DataType.FP32, [1n, 2n], 'data'],
        ['sr', DataType.UNSPECIFIED, [1n], 'randomData'],
      ]);
      expect(request!.warmUp!.samples[0]!.inputs[0]!.contents.value).toEqual(new Uint8Array(Float32Array.of(0.5, -1).buffer));
      expect(run.stderr).not.toContain('warning');

      registry.afterSnapshot = (r) => r.setVersionState('models/cold/versions/1', VersionState.READY, '', 'synthetic warm-up at batch 1 failed on cpu: Pad reflect');
      const cold = await sut(['models', 'register', file.path, '--name', 'cold']);
      expect(cold.code).toBe(0);
      expect(cold.stderr).toContain('warning: cold version 1 serves without warm-up: synthetic warm-up at batch 1 failed on cpu: Pad reflect\n');
      expect(cold.stdout).toMatch(/^cold version 1 is READY \(not warmed up\) in /);
    });

    it('exits 1 before calling the gateway when the --warmup file is wrong, naming the file and the entry', async () => {
      const file = modelFile(10);
      const warmUpFile = join(dir, 'samples.json');
      writeFileSync(warmUpFile, JSON.stringify({ inputs: [{ name: 'sr', datatype: 'INT64', shape: [1], data: [16000.5] }] }));

      const run = await sut(['models', 'register', file.path, '--name', 'vad', '--warmup', warmUpFile]);

      expect(run.code).toBe(1);
      expect(run.stderr).toBe(`infermesh: --warmup ${warmUpFile}: inputs[0]: input "sr": element 0 (16000.5) is not an integer in the INT64 range\n`);
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
      expect(badVersion.stderr).toMatch(/^infermesh: --version must be a positive integer version id, got "v1"\n\nUsage: infermesh models register <file.onnx> --name <name> \[flags\]/);
      expect(badLabel.code).toBe(2);
      expect(badLabel.stderr).toMatch(/^infermesh: --label must look like key=value, got "team"\n/);
      expect(registry.calls).toEqual([]);
    });
  });

  describe('list and show', () => {
    beforeEach(() => {
      registry.seed({
        name: 'models/mlp',
        pinned: true,
        versions: [
          { name: 'models/mlp/versions/1', state: VersionState.READY },
          { name: 'models/mlp/versions/2', state: VersionState.LOADING },
        ],
      });
      registry.seed({ name: 'models/tiny', unloaded: true, versions: [{ name: 'models/tiny/versions/1', state: VersionState.REGISTERED }] });
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
          { name: 'models/mlp', pinned: true, versions: [{ state: 'VERSION_STATE_READY' }, { state: 'VERSION_STATE_LOADING' }] },
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
      expect(registry.requests('getModel')).toMatchObject([{ name: 'models/tiny' }]);
    });

    it("prints the gateway's error with its code and exits 1 for a model that does not exist", async () => {
      const run = await sut(['models', 'show', 'nope']);

      expect(run).toEqual({ code: 1, stdout: '', stderr: 'infermesh: model "nope" not found (NOT_FOUND)\n' });
    });
  });

  describe('load, unload, retire, delete and set-policy', () => {
    beforeEach(() => {
      registry.seed({ name: 'models/mlp', versions: [{ name: 'models/mlp/versions/1', state: VersionState.READY }] });
    });

    it('unloads and loads a model with UpdateModel on "unloaded"', async () => {
      const unload = await sut(['models', 'unload', 'mlp']);
      const unloaded = registry.model('models/mlp')?.unloaded;
      const load = await sut(['models', 'load', 'mlp']);

      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([
        { model: { name: 'models/mlp', unloaded: true }, updateMask: { paths: ['unloaded'] } },
        { model: { name: 'models/mlp', unloaded: false }, updateMask: { paths: ['unloaded'] } },
      ]);
      expect(unloaded).toBe(true);
      expect(registry.model('models/mlp')?.unloaded).toBe(false);
      expect(unload).toMatchObject({ code: 0, stdout: 'mlp is unloaded: its versions drain and stop serving; `infermesh models load mlp` loads it again.\n' });
      expect(load).toMatchObject({ code: 0, stdout: 'mlp loads the versions its policy selects (latest 1 (default)); follow them with `infermesh models show mlp`.\n' });
    });

    it('retires a version', async () => {
      const run = await sut(['models', 'retire', 'mlp', '--version', '1']);

      expect(registry.requests<RetireModelVersionRequest>('retireModelVersion')).toMatchObject([{ name: 'models/mlp/versions/1' }]);
      expect(run).toEqual({ code: 0, stderr: '', stdout: 'mlp version 1: DRAINING\n' });
    });

    it('deletes a model', async () => {
      const run = await sut(['models', 'delete', 'mlp', '--json']);

      expect(registry.requests<DeleteModelRequest>('deleteModel')).toMatchObject([{ name: 'models/mlp' }]);
      expect(registry.model('models/mlp')).toBeUndefined();
      expect(run).toEqual({ code: 0, stderr: '', stdout: '{}\n' });
    });

    it.each([
      [['--latest', '2'], { policy: { case: 'latest', value: 2 } }, 'latest 2'],
      [['--specific', '1,3'], { policy: { case: 'specific', value: { versions: ['1', '3'] } } }, 'specific 1, 3'],
      [['--all'], { policy: { case: 'all', value: {} } }, 'all'],
    ])('sets the version policy %j', async (flags, versionPolicy, text) => {
      const run = await sut(['models', 'set-policy', 'mlp', ...flags]);

      expect(registry.requests<UpdateModelRequest>('updateModel')).toMatchObject([{ model: { name: 'models/mlp', versionPolicy }, updateMask: { paths: ['version_policy'] } }]);
      expect(run).toEqual({ code: 0, stderr: '', stdout: `mlp: version policy ${text}\n` });
    });

    it.each([
      [[], 'give one of --latest <n>, --specific <ids> or --all'],
      [['--latest', '1', '--all'], 'give only one of --latest, --all'],
      [['--specific', '1,x'], '--specific must be a positive integer version id, got "x"'],
    ])('refuses set-policy %j with exit 2 and the usage', async (flags, message) => {
      const run = await sut(['models', 'set-policy', 'mlp', ...flags]);

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(new RegExp(`^infermesh: ${message.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\n\nUsage: infermesh models set-policy <name> \\[flags\\]`));
      expect(registry.requests('updateModel')).toEqual([]);
    });
  });
});
