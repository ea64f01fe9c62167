import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildMlpModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RegistryService, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { API_KEY, type Fixture, runCli, startFixture } from './support/system-fixture';

/** How long a version leaving the serving set drains before it is retired (REGISTRY_DRAIN_GRACE_MS). */
const DRAIN_GRACE_MS = 2_000;

/**
 * Model control through the whole system as an ML engineer does it: the `infermesh` CLI and the
 * gateway's admin API, against six real services. The models are generated here, never downloaded.
 */
describe('model control: CLI, admin API and version switches', () => {
  let fixture: Fixture;
  let workDir: string;
  let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  let registry: ReturnType<typeof createClient<typeof RegistryService>>;

  /** Runs the CLI the way a user does (`npx infermesh ...`), against the fixture's gateway. */
  const cli = (args: string[], timeoutMs = 120_000) => runCli(args, fixture.system.gatewayGrpcAddress, timeoutMs);

  /** One request of `features` values to the model over REST; its status and body. */
  const inferRest = async (model: string, features: number[]) => {
    const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        inputs: [{ name: 'input', shape: [1, features.length], datatype: 'FP32', data: features }],
      }),
      signal: AbortSignal.timeout(20_000),
    });
    return {
      status: res.status,
      body: (await res.json()) as { model_version?: string; error?: string; outputs?: { shape: number[] }[] },
    };
  };

  const writeModel = (file: string, sizes: number[], seed: number) => {
    const path = join(workDir, file);
    writeFileSync(path, buildMlpModel({ sizes, seed }).bytes);
    return path;
  };

  /** Files in the registry's artifact directory, temporary uploads included. */
  const storedArtifacts = () => {
    const dir = join(dirname(fixture.logFile), 'registry', 'artifacts');
    return [...readdirSync(dir), ...readdirSync(join(dir, '.incoming')).map((f) => `.incoming/${f}`)]
      .filter((f) => f !== '.incoming')
      .sort();
  };

  beforeAll(async () => {
    workDir = mkdtempSync(join(tmpdir(), 'infermesh-model-control-'));
    fixture = await startFixture({
      models: ['tiny'],
      env: { REGISTRY_DRAIN_GRACE_MS: String(DRAIN_GRACE_MS), ROUTER_CACHE_ENABLED: 'false' },
    });
    grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
  }, 120_000);

  afterAll(async () => {
    grpc?.close();
    registry?.close();
    await fixture?.stop();
    rmSync(workDir, { recursive: true, force: true });
  });

  it('registers a fresh ONNX file with the CLI, exits 0 only once READY, and the model serves at once over REST and gRPC', async () => {
    const file = writeModel('fresh.onnx', [6, 16, 3], 11);

    const started = Date.now();
    const result = await cli(['models', 'register', file, '--name', 'fresh']);
    const elapsedMs = Date.now() - started;

    expect({ code: result.code, stderr: result.stderr }).toEqual({ code: 0, stderr: expect.any(String) });
    const { model } = await registry.getModel({ name: 'models/fresh' });
    expect(model!.versions.map((v) => [v.name, v.state])).toEqual([['models/fresh/versions/1', VersionState.READY]]);
    // The signature comes from the file: nobody typed it.
    const metadata = (await (
      await fetch(`${fixture.system.gatewayUrl}/v2/models/fresh`, { headers: { authorization: `Bearer ${API_KEY}` } })
    ).json()) as { inputs: unknown[]; outputs: unknown[] };
    expect(metadata.inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, 6] }]);
    expect(metadata.outputs).toEqual([{ name: 'output', datatype: 'FP32', shape: [-1, 3] }]);

    const rest = await inferRest('fresh', [1, 2, 3, 4, 5, 6]);
    expect(rest.status).toBe(200);
    expect(rest.body.outputs?.[0]?.shape).toEqual([1, 3]);
    const response = await grpc.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: 'fresh',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 6n], contents: { fp32Contents: [1, 2, 3, 4, 5, 6] } }],
      }),
      { metadata: { authorization: `Bearer ${API_KEY}` }, timeoutMs: 20_000 },
    );
    expect(response.modelVersion).toBe('1');
    console.log(
      `models register → READY for a ${(buildMlpModel({ sizes: [6, 16, 3], seed: 11 }).bytes.length / 1024).toFixed(1)} KiB model: ${elapsedMs} ms (CLI process included)`,
    );
  });

  it('registers the ~25 MB MLP with the CLI and serves it once the CLI exits', async () => {
    const file = join(workDir, 'mlp.onnx');
    const bytes = buildMlpModel({ name: 'big' }).bytes;
    writeFileSync(file, bytes);

    const started = Date.now();
    const result = await cli(['models', 'register', file, '--name', 'big', '--json']);
    const elapsedMs = Date.now() - started;

    expect(result.code).toBe(0);
    const features = Array.from({ length: 512 }, (_, i) => i / 512);
    const served = await inferRest('big', features);
    expect(served.status).toBe(200);
    expect(served.body.outputs?.[0]?.shape).toEqual([1, 512]);
    console.log(
      `models register → READY for the ${(bytes.length / 2 ** 20).toFixed(1)} MiB MLP: ${elapsedMs} ms (CLI process included)`,
    );
  }, 120_000);

  it('switches a model to a new version under 50 requests/s without a failed request, and the responses switch once', async () => {
    const v1 = writeModel('switch-1.onnx', [6, 16, 3], 21);
    expect((await cli(['models', 'register', v1, '--name', 'switching'])).code).toBe(0);

    const served: string[] = [];
    const failures: string[] = [];
    let stop = false;
    const client = (async () => {
      // Closed loop, paced to 50 requests/s: the next request starts 20 ms after the last one started,
      // or when it is answered if that takes longer.
      for (let i = 0; !stop; i++) {
        const started = Date.now();
        const { status, body } = await inferRest('switching', [i, 1, 2, 3, 4, 5]);
        if (status === 200) served.push(body.model_version!);
        else failures.push(`${status} ${body.error}`);
        await new Promise((r) => setTimeout(r, Math.max(0, 20 - (Date.now() - started))));
      }
    })();

    await new Promise((r) => setTimeout(r, 2_000));
    const v2 = writeModel('switch-2.onnx', [6, 16, 3], 22);
    const registered = await cli(['models', 'register', v2, '--name', 'switching']);
    expect(registered.code).toBe(0);
    // Past the drain grace: version 1 drains, is retired and unloaded while the client goes on.
    const retiredBy = Date.now() + DRAIN_GRACE_MS + 10_000;
    for (;;) {
      const { model } = await registry.getModel({ name: 'models/switching' });
      if (model!.versions[0]!.state === VersionState.RETIRED || Date.now() > retiredBy) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    await new Promise((r) => setTimeout(r, 2_000));
    stop = true;
    await client;

    const runs = served.reduce<{ version: string; count: number }[]>((acc, version) => {
      if (acc.at(-1)?.version === version) acc.at(-1)!.count += 1;
      else acc.push({ version, count: 1 });
      return acc;
    }, []);
    console.log(
      `version switch under load: ${served.length + failures.length} requests, ${failures.length} failed, ` +
        `served by ${runs.map((r) => `v${r.version}×${r.count}`).join(' then ')}`,
    );
    expect(failures).toEqual([]);
    expect(runs.map((r) => r.version)).toEqual(['1', '2']);
    const { model } = await registry.getModel({ name: 'models/switching' });
    expect(model!.versions.map((v) => v.state)).toEqual([VersionState.RETIRED, VersionState.READY]);
  }, 120_000);

  it('refuses a corrupt or non-ONNX upload and keeps none of its bytes', async () => {
    const before = storedArtifacts();
    const junk = join(workDir, 'junk.onnx');
    writeFileSync(junk, Buffer.from('this is not an ONNX model at all, just text'));
    const truncated = join(workDir, 'truncated.onnx');
    const whole = buildMlpModel({ sizes: [6, 16, 3], seed: 31 }).bytes;
    writeFileSync(truncated, whole.subarray(0, Math.floor(whole.length / 2)));

    for (const file of [junk, truncated]) {
      const result = await cli(['models', 'register', file, '--name', 'broken']);
      expect(result.code).toBe(1);
      expect(result.stderr).toMatch(/ONNX|onnxruntime/);
    }
    const rest = await fetch(`${fixture.system.gatewayUrl}/admin/v1/artifacts`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/octet-stream' },
      body: Buffer.from('still not a model'),
    });
    expect(rest.status).toBe(400);
    expect(((await rest.json()) as { error: string }).error).toMatch(/ONNX/);

    expect(storedArtifacts()).toEqual(before);
    await expect(registry.getModel({ name: 'models/broken' })).rejects.toMatchObject({ code: 5 });
  });

  it("unloads and loads a model with Triton's repository API, and refuses to retire a version that serves", async () => {
    const headers = { authorization: `Bearer ${API_KEY}` };
    const retire = await fetch(`${fixture.system.gatewayUrl}/admin/v1/models/fresh/versions/1/retire`, {
      method: 'POST',
      headers,
    });
    expect(retire.status).toBe(409);
    expect(((await retire.json()) as { error: string }).error).toMatch(/serves traffic|still serves/);

    expect(
      (await fetch(`${fixture.system.gatewayUrl}/v2/repository/models/fresh/unload`, { method: 'POST', headers }))
        .status,
    ).toBe(200);
    let unloaded = await inferRest('fresh', [1, 2, 3, 4, 5, 6]);
    for (const end = Date.now() + 10_000; unloaded.status === 200 && Date.now() < end;)
      unloaded = await inferRest('fresh', [1, 2, 3, 4, 5, 6]);
    expect(unloaded.status).toBe(503);
    expect(unloaded.body.error).toMatch(/unloaded/);

    expect(
      (await fetch(`${fixture.system.gatewayUrl}/v2/repository/models/fresh/load`, { method: 'POST', headers })).status,
    ).toBe(200);
    let loaded = await inferRest('fresh', [1, 2, 3, 4, 5, 6]);
    for (const end = Date.now() + 30_000; loaded.status !== 200 && Date.now() < end;) {
      await new Promise((r) => setTimeout(r, 200));
      loaded = await inferRest('fresh', [1, 2, 3, 4, 5, 6]);
    }
    expect(loaded.status).toBe(200);
  }, 60_000);

  it("keeps the registry's models across a registry restart", async () => {
    const snapshot = async () =>
      (await registry.listModels({})).models.map((m) => [
        m.name,
        m.revision,
        m.unloaded,
        m.versions.map((v) => [v.name, v.state, v.artifact?.sha256]),
      ]);
    const before = await snapshot();
    const pid = fixture.system.process('registry').pid;
    // Killed, not stopped: nothing gets the chance to be flushed on the way out.
    await fixture.system.process('registry').kill();
    await fixture.system.restart('registry');

    expect(fixture.system.process('registry').pid).not.toBe(pid);
    expect(await snapshot()).toEqual(before);
    expect(before.map(([name]) => name)).toEqual(
      expect.arrayContaining(['models/big', 'models/fresh', 'models/switching', 'models/tiny']),
    );
  });
});
