import { createClient } from '@infermesh/grpc';
import { buildReflectPadModel, buildSampleRateModel, type BuiltModel } from '@infermesh/model-builder';
import { RegistryService, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import * as ort from 'onnxruntime-node';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { API_KEY, type Fixture, runCli, startFixture } from './support/system-fixture';

interface RestTensor {
  name: string;
  datatype: string;
  shape: number[];
  data: number[];
}

/** Audio that a model needing a minimum length accepts: 512 samples of a sine. */
const AUDIO = Array.from({ length: 512 }, (_, i) => Math.fround(Math.sin(i / 8) / 2));

/**
 * Registering real-world-like models whose synthetic warm-up fails (a minimum input length, a value in
 * a set), as an ML engineer does it: the `infermesh` CLI with and without a warm-up file, against six
 * real services; their answers compared with onnxruntime-node run in-process on the same model.
 */
describe('warm-up: samples given at registration', () => {
  let fixture: Fixture;
  let workDir: string;
  let registry: ReturnType<typeof createClient<typeof RegistryService>>;
  let worker: ReturnType<typeof createClient<typeof WorkerService>>;

  /** Runs the CLI the way a user does (`npx infermesh ...`), against the fixture's gateway. */
  const cli = (args: string[], timeoutMs = 60_000) => runCli(args, fixture.system.gatewayGrpcAddress, timeoutMs);

  const write = (file: string, content: Uint8Array | object) => {
    const path = join(workDir, file);
    writeFileSync(path, content instanceof Uint8Array ? content : JSON.stringify(content));
    return path;
  };

  /** Registers `model` as `name` with the CLI, with the warm-up file when one is given. */
  const register = (model: BuiltModel, name: string, warmUp?: object) =>
    cli([
      'models',
      'register',
      write(`${name}.onnx`, model.bytes),
      '--name',
      name,
      ...(warmUp === undefined ? [] : ['--warmup', write(`${name}.json`, warmUp)]),
    ]);

  const version = async (name: string) => (await registry.getModel({ name: `models/${name}` })).model!.versions[0]!;

  /** One request over REST; the outputs by name, each value as the float32 it stands for. */
  const inferRest = async (model: string, inputs: object[]) => {
    const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs }),
      signal: AbortSignal.timeout(20_000),
    });
    const body = (await res.json()) as { outputs?: RestTensor[]; error?: string };
    if (res.status !== 200) throw new Error(`${model}: ${res.status} ${body.error}`);
    return Object.fromEntries(body.outputs!.map((o) => [o.name, { shape: o.shape, data: o.data.map(Math.fround) }]));
  };

  /** What onnxruntime-node answers in-process for the same model and inputs. */
  const direct = async (model: BuiltModel, feeds: Record<string, ort.Tensor>) => {
    const session = await ort.InferenceSession.create(model.bytes, {
      executionProviders: ['cpu'],
      intraOpNumThreads: 1,
    });
    try {
      const out = await session.run(feeds);
      return Object.fromEntries(
        Object.entries(out).map(([name, t]) => [
          name,
          { shape: [...t.dims], data: Array.from(t.data as Float32Array) },
        ]),
      );
    } finally {
      await session.release();
    }
  };

  const padRequest = (samples: number[], rows = 1) => [
    { name: 'audio', datatype: 'FP32', shape: [rows, samples.length / rows], data: samples },
  ];
  const padFeeds = (samples: number[], rows = 1) => ({
    audio: new ort.Tensor('float32', Float32Array.from(samples), [rows, samples.length / rows]),
  });
  const rateRequest = (samples: number[], sr: number) => [
    ...padRequest(samples),
    { name: 'sr', datatype: 'INT64', shape: [1], data: [sr] },
  ];
  const rateFeeds = (samples: number[], sr: number) => ({
    ...padFeeds(samples),
    sr: new ort.Tensor('int64', BigInt64Array.of(BigInt(sr)), [1]),
  });

  /** Warm-up files as a user writes them by hand. */
  const PAD_WARM_UP = { inputs: [{ name: 'audio', datatype: 'FP32', shape: [1, 512], data: AUDIO }] };
  const rateSample = (sr: number) => ({
    name: `${sr / 1000} kHz`,
    inputs: [
      { name: 'audio', shape: [1, 512], random_data: true },
      { name: 'sr', datatype: 'INT64', shape: [1], data: [sr] },
    ],
  });

  beforeAll(async () => {
    workDir = mkdtempSync(join(tmpdir(), 'infermesh-warm-up-'));
    fixture = await startFixture({
      models: ['tiny'],
      env: { ROUTER_CACHE_ENABLED: 'false', WORKER_WARMUP_BATCH_SIZES: '1,max' },
    });
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    worker = createClient(WorkerService, fixture.system.grpcAddress('worker'));
  }, 120_000);

  afterAll(async () => {
    registry?.close();
    worker?.close();
    await fixture?.stop();
    rmSync(workDir, { recursive: true, force: true });
  });

  it('registers a model that needs a minimum length READY and warmed up with a warm-up file, and it answers like onnxruntime-node', async () => {
    const model = buildReflectPadModel();
    const result = await register(model, 'pad', PAD_WARM_UP);

    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 0,
      stderr: expect.not.stringContaining('warning'),
    });
    expect(result.stdout).toMatch(/^pad version 1 is READY in /);
    expect(await version('pad')).toMatchObject({ state: VersionState.READY, warmUpError: '' });
    const rows = [...AUDIO.slice(0, 100), ...AUDIO.slice(200, 300)];
    expect(await inferRest('pad', padRequest(rows, 2))).toEqual(await direct(model, padFeeds(rows, 2)));
  });

  it('registers a model that needs its sample rate in a set READY and warmed up with named samples, and it answers like onnxruntime-node', async () => {
    const model = buildSampleRateModel();
    const result = await register(model, 'rate', { samples: [rateSample(8000), rateSample(16000)] });

    expect(result.code).toBe(0);
    expect(await version('rate')).toMatchObject({ state: VersionState.READY, warmUpError: '' });
    expect((await version('rate')).warmUp!.samples.map((s) => s.name)).toEqual(['8 kHz', '16 kHz']);
    const show = await cli(['models', 'show', 'rate']);
    expect(show.stdout).toContain('Warm-up: 2 samples given ("8 kHz", "16 kHz"); warmed up');
    for (const sr of [8000, 16000]) {
      expect(await inferRest('rate', rateRequest(AUDIO.slice(0, 64), sr))).toEqual(
        await direct(model, rateFeeds(AUDIO.slice(0, 64), sr)),
      );
    }
  });

  it('registers both without a warm-up READY but not warmed up, saying why everywhere, and they still answer valid requests', async () => {
    const pad = buildReflectPadModel();
    const rate = buildSampleRateModel();
    const padResult = await register(pad, 'pad-cold');
    const rateResult = await register(rate, 'rate-cold');

    expect(padResult.code).toBe(0);
    expect(padResult.stderr).toMatch(
      /warning: pad-cold version 1 serves without warm-up: synthetic warm-up at batch 1 failed on cpu: .*Pad reflect requires axis length >= 2/,
    );
    expect(padResult.stdout).toMatch(/^pad-cold version 1 is READY \(not warmed up\) in /);
    expect(rateResult.code).toBe(0);
    expect(await version('pad-cold')).toMatchObject({
      state: VersionState.READY,
      warmUpError: expect.stringMatching(/Pad reflect requires axis length >= 2/),
    });
    expect(await version('rate-cold')).toMatchObject({
      state: VersionState.READY,
      warmUpError: expect.stringMatching(/indices element out of data bounds/),
    });
    const listed = Object.fromEntries(
      (await worker.listModels({})).models.map((m) => [m.name, [m.state, m.warmUpError]]),
    );
    expect(listed['models/pad-cold/versions/1']).toEqual([
      ModelState.READY,
      expect.stringMatching(/^synthetic warm-up at batch 1 failed on cpu: /),
    ]);
    expect(listed['models/pad/versions/1']).toEqual([ModelState.READY, '']);
    const show = await cli(['models', 'show', 'rate-cold']);
    expect(show.stdout).toMatch(
      /Warm-up: synthetic \(no samples given\); NOT warmed up: synthetic warm-up at batch 1 failed on cpu: .*indices element out of data bounds/,
    );

    expect(await inferRest('pad-cold', padRequest(AUDIO.slice(0, 3)))).toEqual(
      await direct(pad, padFeeds(AUDIO.slice(0, 3))),
    );
    expect(await inferRest('rate-cold', rateRequest(AUDIO.slice(0, 16), 16000))).toEqual(
      await direct(rate, rateFeeds(AUDIO.slice(0, 16), 16000)),
    );
  });

  it("FAILS a version whose warm-up the model refuses, with onnxruntime's message, and refuses one that does not fit the signature before registering", async () => {
    const bad = await register(buildSampleRateModel(), 'rate-bad', { samples: [rateSample(16000), rateSample(44100)] });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(
      /infermesh: rate-bad version 1 FAILED: warm-up sample "44\.1 kHz" failed on cpu: .*Gather node.*indices element out of data bounds/,
    );
    expect(await version('rate-bad')).toMatchObject({
      state: VersionState.FAILED,
      stateReason: expect.stringMatching(/indices element out of data bounds/),
    });

    const short = await register(buildReflectPadModel(), 'pad-bad', {
      inputs: [{ name: 'audio', shape: [1, 1], zero_data: true }],
    });
    expect(short.code).toBe(1);
    expect(short.stderr).toMatch(
      /pad-bad version 1 FAILED: warm-up sample 1 failed on cpu: .*Pad reflect requires axis length >= 2/,
    );

    const misfit = await register(buildSampleRateModel(), 'rate-misfit', {
      inputs: [
        { name: 'audio', shape: [1, 512], zero_data: true },
        { name: 'sr', datatype: 'INT64', shape: [2], data: [8000, 16000] },
      ],
    });
    expect(misfit.code).toBe(1);
    expect(misfit.stderr).toContain('warm_up: samples[0] input "sr" has shape [2] but the model expects [1]');
    expect(misfit.stderr).toContain('INVALID_ARGUMENT');
    await expect(registry.getModel({ name: 'models/rate-misfit' })).rejects.toMatchObject({ code: 5 });
  });

  it('takes the warm-up in the protobuf JSON of the admin REST route', async () => {
    const model = buildSampleRateModel('rate-rest');
    const headers = { authorization: `Bearer ${API_KEY}` };
    const uploaded = await fetch(`${fixture.system.gatewayUrl}/admin/v1/artifacts`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/octet-stream' },
      body: model.bytes,
    });
    const { sha256 } = (await uploaded.json()) as { sha256: string };
    const rate = Buffer.from(BigInt64Array.of(16000n).buffer).toString('base64');
    const created = await fetch(`${fixture.system.gatewayUrl}/admin/v1/models/rate-rest/versions`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json' },
      body: JSON.stringify({
        versionId: '1',
        artifactSha256: sha256,
        warmUp: {
          samples: [
            {
              name: '16 kHz',
              inputs: [
                { name: 'audio', shape: ['1', '256'], zeroData: true },
                { name: 'sr', datatype: 'DATA_TYPE_INT64', shape: ['1'], data: rate },
              ],
            },
          ],
        },
      }),
    });
    expect(created.status).toBe(200);
    const deadline = Date.now() + 30_000;
    while ((await version('rate-rest')).state !== VersionState.READY && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    expect(await version('rate-rest')).toMatchObject({ state: VersionState.READY, warmUpError: '' });
    expect(await inferRest('rate-rest', rateRequest(AUDIO.slice(0, 8), 8000))).toEqual(
      await direct(model, rateFeeds(AUDIO.slice(0, 8), 8000)),
    );
  });
});
