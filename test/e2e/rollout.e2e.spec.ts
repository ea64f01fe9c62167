import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildMlpModel, buildTinyModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { RegistryService, type RolloutPolicySchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { registerModel, waitForVersionsReady } from '@infermesh/system';
import { API_KEY, type Fixture, metricValue, startFixture } from './support/system-fixture';

const CONCURRENCY = 32;

/**
 * Rollouts through the whole system: the tiny model registered as versions 1 and 2, a policy set on
 * the registry, and requests through the gateway's gRPC API, each answered with the version that
 * served it. The result cache is off, so that every request is routed.
 */
describe('rollouts through the whole system', () => {
  let fixture: Fixture;
  let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  let registry: ReturnType<typeof createClient<typeof RegistryService>>;

  const infer = async (routingKey?: string, input = [1, 2, 3, 4]) => {
    const response = await grpc.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: 'tiny',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n], contents: { fp32Contents: input } }],
      }),
      {
        metadata: {
          authorization: `Bearer ${API_KEY}`,
          ...(routingKey !== undefined && { 'x-routing-key': routingKey }),
        },
        timeoutMs: 30_000,
      },
    );
    return response.modelVersion;
  };

  /** Runs `count` calls of `call(i)` with CONCURRENCY in flight; results in call order. */
  async function many<T>(count: number, call: (i: number) => Promise<T>): Promise<T[]> {
    const results = new Array<T>(count);
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < count) {
          const i = next++;
          results[i] = await call(i);
        }
      }),
    );
    return results;
  }

  /** Sets a policy and waits until the router follows it: its registry watch applies a change within a second. */
  async function setPolicy(policy: MessageInitShape<typeof RolloutPolicySchema>): Promise<void> {
    await registry.setRolloutPolicy({ model: 'models/tiny', policy });
    await new Promise((r) => setTimeout(r, 1_000));
  }

  beforeAll(async () => {
    fixture = await startFixture({ models: ['tiny'], env: { ROUTER_CACHE_ENABLED: 'false' } });
    grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    // Every version stays loaded whatever the policy names (the default version policy, latest 1,
    // would drain versions 1 and 2 once version 3 is READY).
    await registry.updateModel({
      model: { name: 'models/tiny', versionPolicy: { policy: { case: 'all', value: {} } } },
      updateMask: { paths: ['version_policy'] },
    });
    // Version 2 is the same model again; version 3 has the same signature and other weights.
    const second = await registerModel(registry, 'tiny', '2', buildTinyModel().bytes);
    const perturbed = await registerModel(registry, 'tiny', '3', buildMlpModel({ sizes: [4, 16, 3], seed: 7 }).bytes);
    await waitForVersionsReady(registry, [second.name, perturbed.name], 60_000);
  }, 120_000);

  afterAll(async () => {
    grpc?.close();
    registry?.close();
    await fixture?.stop();
  });

  it('sends a 10 % canary 10 ± 2 % of 10,000 requests, and the rest to the stable version', async () => {
    await setPolicy({ stableVersion: '1', canary: { version: '2', percent: 10 } });

    const served = await many(10_000, () => infer());

    const canary = served.filter((v) => v === '2').length;
    process.stdout.write(`canary: ${canary} of 10000 requests (${(canary / 100).toFixed(2)} %)\n`);
    expect(canary).toBeGreaterThanOrEqual(800);
    expect(canary).toBeLessThanOrEqual(1_200);
    expect(served.filter((v) => v !== '1' && v !== '2')).toEqual([]);
  }, 180_000);

  it('keeps each of 1,000 routing keys on one version while the variant grows from 10 % to 50 %, moving only the keys that must', async () => {
    const keys = Array.from({ length: 1_000 }, (_, i) => `user-${i}`);
    await setPolicy({ stableVersion: '1', variants: [{ version: '2', percent: 10 }] });
    const before = await many(keys.length, (i) => infer(keys[i]));
    expect(await many(keys.length, (i) => infer(keys[i]))).toEqual(before);

    await setPolicy({ stableVersion: '1', variants: [{ version: '2', percent: 50 }] });
    const after = await many(keys.length, (i) => infer(keys[i]));
    expect(await many(keys.length, (i) => infer(keys[i]))).toEqual(after);

    const onTwo = (list: string[]) => list.filter((v) => v === '2').length;
    const moved = keys.filter((_, i) => before[i] !== after[i]).length;
    process.stdout.write(
      `A/B: ${onTwo(before)} of 1000 keys on version 2 at 10 %, ${onTwo(after)} at 50 %; ${moved} keys moved, all from 1 to 2\n`,
    );
    expect(keys.filter((_, i) => before[i] === '2' && after[i] !== '2')).toEqual([]);
    expect(moved).toBe(onTwo(after) - onTwo(before));
    expect(onTwo(before)).toBeGreaterThan(60);
    expect(onTwo(before)).toBeLessThan(140);
    expect(onTwo(after)).toBeGreaterThan(440);
    expect(onTwo(after)).toBeLessThan(560);
  }, 180_000);

  it('compares a 100 % shadow with the served version: agreement exactly 1.0 for the same model, below 1.0 for another', async () => {
    const router = (name: string, shadow: string) =>
      metricValue(fixture.system.metricsUrl('router'), `infermesh_router_${name}`, {
        model: 'tiny',
        primary: '1',
        shadow,
      });
    const inputs = Array.from({ length: 200 }, (_, i) => [
      Math.sin(i),
      Math.cos(i * 3),
      Math.sin(i * 7),
      Math.cos(i * 11),
    ]);
    const agreement = async (shadow: string) => {
      await setPolicy({ stableVersion: '1', shadow: { version: shadow, percent: 100 } });
      const served = await many(inputs.length, (i) => infer(undefined, inputs[i]));
      expect(new Set(served)).toEqual(new Set(['1']));
      for (let i = 0; i < 300 && (await router('shadow_requests_total', shadow)) < inputs.length; i++)
        await new Promise((r) => setTimeout(r, 50));
      expect(await router('shadow_requests_total', shadow)).toBe(inputs.length);
      return (
        (await router('shadow_agreed_items_total', shadow)) / (await router('shadow_compared_items_total', shadow))
      );
    };

    const same = await agreement('2');
    const other = await agreement('3');
    process.stdout.write(`shadow agreement: ${same} with the same model, ${other.toFixed(3)} with other weights\n`);
    expect(same).toBe(1);
    expect(other).toBeLessThan(1);
  }, 180_000);
});
