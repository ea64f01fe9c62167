import { create } from '@bufbuild/protobuf';
import { createClient, RpcError } from '@infermesh/grpc';
import { buildInputRangeModel, buildSlowModel, buildTinyModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  AutoRolloutPhase,
  type Model,
  RegistryService,
  RolloutDecision,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { registerModel, waitForVersionsReady } from '@infermesh/system';
import { SERVICE_NAMES, type ServiceName } from '@infermesh/system';
import { freePortList } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Prometheus, promGet, startPrometheus, stopPrometheus, type Target, waitFor } from './support/prometheus';
import { API_KEY, type Fixture, metricValue, runCli, startFixture } from './support/system-fixture';

const CONCURRENCY = 8;
/** The input-range canary fails on a first feature at or above this; the traffic's first features spread over twice it. */
const RANGE_ROWS = 8;

type Registry = ReturnType<typeof createClient<typeof RegistryService>>;

/**
 * Requests to `tiny` that name no version, CONCURRENCY at a time until stopped, each with a random
 * first feature in [0, 2 × RANGE_ROWS); what each version answered and every failure are counted.
 */
class Traffic {
  readonly served = new Map<string, number>();
  readonly failures: string[] = [];
  private running = true;
  private readonly loops: Promise<void>[];

  constructor(grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>, concurrency = CONCURRENCY) {
    this.loops = Array.from({ length: concurrency }, async () => {
      while (this.running) {
        const first = Math.floor(Math.random() * 2 * RANGE_ROWS);
        try {
          const response = await grpc.modelInfer(
            create(ModelInferRequestSchema, {
              modelName: 'tiny',
              inputs: [
                { name: 'input', datatype: 'FP32', shape: [1n, 4n], contents: { fp32Contents: [first, 1, 2, 3] } },
              ],
            }),
            { metadata: { authorization: `Bearer ${API_KEY}` }, timeoutMs: 30_000 },
          );
          this.served.set(response.modelVersion, (this.served.get(response.modelVersion) ?? 0) + 1);
        } catch (error) {
          this.failures.push(error instanceof RpcError ? `${error.code} ${error.message}` : String(error));
        }
      }
    });
  }

  async stop(): Promise<void> {
    this.running = false;
    await Promise.all(this.loops);
  }

  get total(): number {
    return [...this.served.values()].reduce((a, b) => a + b, 0) + this.failures.length;
  }
}

/**
 * Automatic rollouts through the whole system: versions of `tiny` rolled out by the registry while
 * clients keep sending requests, the registry judging the canary on what the router reports. Steps
 * and intervals are short here; the defaults are minutes.
 */
describe('automatic rollouts through the whole system', () => {
  let fixture: Fixture;
  let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  let registry: Registry;

  const model = async (): Promise<Model> => (await registry.getModel({ name: 'models/tiny' })).model!;
  const decisions = (m: Model, since: number) => m.rolloutHistory.slice(since).map((e) => RolloutDecision[e.decision]);
  const register = async (versionId: string, bytes: Uint8Array) => {
    const version = await registerModel(registry, 'tiny', versionId, bytes);
    await waitForVersionsReady(registry, [version.name], 60_000);
  };
  /** Waits until the model's automatic rollout is in one of `phases`; the model then. */
  const waitForPhase = async (phases: AutoRolloutPhase[], timeoutMs: number): Promise<Model> => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = await model();
      if (m.autoRollout !== undefined && phases.includes(m.autoRollout.phase)) return m;
      if (Date.now() > deadline) {
        const figures = m.autoRollout?.figures;
        throw new Error(
          `the rollout is still ${AutoRolloutPhase[m.autoRollout?.phase ?? 0]} (${m.autoRollout?.reason}) after ${timeoutMs} ms; ` +
            `canary ${figures?.canary?.requests} requests, p99 ${figures?.canary?.p99Ms} ms; stable ${figures?.stable?.requests}, p99 ${figures?.stable?.p99Ms} ms\n${fixture.logTail(10)}`,
        );
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  };
  /** Requests the router answered with a failure, per version. */
  const routerFailures = async (version: string) => {
    const url = fixture.system.metricsUrl('router');
    return (
      (await metricValue(url, 'infermesh_router_requests_total', { model: 'tiny', version })) -
      (await metricValue(url, 'infermesh_router_requests_total', { model: 'tiny', version, outcome: 'OK' }))
    );
  };

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      env: { ROUTER_CACHE_ENABLED: 'false', REGISTRY_ROLLOUT_TICK_MS: '200', ROUTER_TRAFFIC_REPORT_INTERVAL_MS: '200' },
    });
    grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    // Version 1 keeps serving while the next versions arrive (the version policy serves only the latest).
    await registry.setRolloutPolicy({ model: 'models/tiny', policy: { stableVersion: '1' } });
  }, 120_000);

  // A test that failed leaves no rollout in progress to the next: a paused one is replaced.
  afterEach(async () => {
    if ((await model()).autoRollout?.phase === AutoRolloutPhase.PROGRESSING)
      await registry.updateRollout({ model: 'models/tiny', action: { case: 'pause', value: true } });
  });

  afterAll(async () => {
    grpc?.close();
    registry?.close();
    await fixture?.stop();
  });

  it('promotes a healthy canary through every step (CLI), with no request lost, and retires the old version', async () => {
    await register('2', buildTinyModel().bytes);
    const traffic = new Traffic(grpc);
    try {
      const cli = await runCli(
        [
          'rollout',
          'auto',
          'tiny',
          '--version',
          '2',
          '--steps',
          '20,50,100',
          '--interval',
          '1500ms',
          '--min-requests',
          '40',
          // At the last step the canary is compared with the stable version over the step before, another
          // 1.5 s of this 2-core machine: whatever else ran in one and not the other moves the ratio
          // (3.2× seen with a linter running beside the test; 0.6 to 2.0× without).
          '--max-p99-ratio',
          '5',
          '--wait',
        ],
        fixture.system.gatewayGrpcAddress,
      );
      // The CLI's output is part of the expectation (in full when it failed) so that a failure shows why the rollout ended.
      expect({ code: cli.code, stderr: cli.code === 0 ? '' : cli.stderr }).toEqual({ code: 0, stderr: '' });
      // --wait prints each decision as it comes.
      expect(cli.stderr).toMatch(/STARTED .*\n.*ADVANCED .*\n.*ADVANCED .*\n.*PROMOTED /);
    } finally {
      await traffic.stop();
    }

    const promoted = await model();
    expect(promoted.autoRollout?.phase).toBe(AutoRolloutPhase.PROMOTED);
    expect(decisions(promoted, 0)).toEqual(['STARTED', 'ADVANCED', 'ADVANCED', 'PROMOTED']);
    expect(promoted.rolloutHistory.map((e) => e.percent)).toEqual([20, 50, 100, 100]);
    expect(promoted.rollout?.stableVersion).toBe('2');
    const old = promoted.versions.find((v) => v.name.endsWith('/versions/1'))!;
    expect(old.state === VersionState.RETIRED || old.stateReason.includes('retired')).toBe(true);
    expect(traffic.failures).toEqual([]);
    const p99Ratios = promoted.rolloutHistory.flatMap(
      (e) => e.figures?.gates.filter((g) => g.gate === 'p99_ratio').map((g) => g.value.toFixed(2)) ?? [],
    );
    process.stdout.write(
      `healthy canary: ${JSON.stringify(Object.fromEntries(traffic.served))} served, ${traffic.failures.length} failed; p99 ratio per step ${p99Ratios.join(', ')}\n`,
    );

    const history = await runCli(['rollout', 'history', 'tiny'], fixture.system.gatewayGrpcAddress);
    expect(history.code).toBe(0);
    expect(history.stdout).toMatch(/STARTED[\s\S]*ADVANCED[\s\S]*ADVANCED[\s\S]*PROMOTED/);
  }, 180_000);

  it('rolls back a canary that fails on part of its inputs at the first step, and no request outside its share fails', async () => {
    await register('3', buildInputRangeModel(RANGE_ROWS).bytes);
    const before = await model();
    const since = before.rolloutHistory.length;
    // Version 2 after the test before this one promoted it.
    const stable = before.rollout!.stableVersion;
    const stableFailuresBefore = await routerFailures(stable);
    const traffic = new Traffic(grpc);
    try {
      await registry.startAutoRollout({
        model: 'models/tiny',
        version: '3',
        // A step far longer than the test: only a gate can end it.
        analysis: { steps: [20, 50, 100], intervalMs: 600_000n, minRequests: 40n, maxErrorRateIncrease: 0.01 },
      });
      const rolledBack = await waitForPhase(
        [AutoRolloutPhase.ROLLED_BACK, AutoRolloutPhase.PROMOTED, AutoRolloutPhase.ABORTED],
        60_000,
      );
      await new Promise((r) => setTimeout(r, 1_000));

      expect(rolledBack.autoRollout?.phase).toBe(AutoRolloutPhase.ROLLED_BACK);
      expect(decisions(rolledBack, since)).toEqual(['STARTED', 'ROLLED_BACK']);
      const verdict = rolledBack.rolloutHistory.at(-1)!;
      expect(verdict.step).toBe(0);
      expect(verdict.figures!.canary!.requests).toBeGreaterThanOrEqual(40n);
      expect(verdict.figures!.canary!.errors).toBeGreaterThan(0n);
      expect(rolledBack.versions.find((v) => v.name.endsWith('/versions/3'))?.rollbackReason).toMatch(
        /^error_rate_increase gate failed/,
      );
      expect(rolledBack.rollout?.canary).toBeUndefined();
    } finally {
      await traffic.stop();
    }
    // Every failure was the canary's: the stable version failed none, and the router counted each.
    expect(await routerFailures(stable)).toBe(stableFailuresBefore);
    expect(await routerFailures('3')).toBe(traffic.failures.length);
    expect(traffic.failures.length).toBeGreaterThan(0);
    process.stdout.write(
      `failing canary: ${JSON.stringify(Object.fromEntries(traffic.served))} served, ${traffic.failures.length} failed (all on version 3)\n`,
    );
    // After the rollback every request goes to the stable version, and none fails.
    const after = new Traffic(grpc);
    await new Promise((r) => setTimeout(r, 1_500));
    await after.stop();
    expect(after.failures).toEqual([]);
    expect([...after.served.keys()]).toEqual([stable]);
  }, 180_000);

  it('rolls back a much slower canary on the latency gate', async () => {
    await register('4', buildSlowModel({ layers: 160 }).bytes);
    const since = (await model()).rolloutHistory.length;
    // A light load, so that the stable version's latency is the path's, not a queue's.
    const traffic = new Traffic(grpc, 2);
    try {
      await registry.startAutoRollout({
        model: 'models/tiny',
        version: '4',
        // The CLI's default latency gate, judged over the whole first step.
        analysis: {
          steps: [20, 100],
          intervalMs: 3_000n,
          minRequests: 40n,
          maxErrorRateIncrease: 0.01,
          maxP99Ratio: 1.2,
        },
      });
      const rolledBack = await waitForPhase(
        [AutoRolloutPhase.ROLLED_BACK, AutoRolloutPhase.PROMOTED, AutoRolloutPhase.ABORTED],
        90_000,
      );

      expect(decisions(rolledBack, since)).toEqual(['STARTED', 'ROLLED_BACK']);
      const gate = rolledBack.rolloutHistory.at(-1)!.figures!.gates.find((g) => g.gate === 'p99_ratio')!;
      expect(gate).toMatchObject({ checked: true, passed: false });
      process.stdout.write(
        `slow canary: p99 ${gate.value.toFixed(1)}× the stable version's (${rolledBack.rolloutHistory.at(-1)!.reason})\n`,
      );
    } finally {
      await traffic.stop();
    }
    expect(traffic.failures).toEqual([]);
  }, 180_000);

  it('resumes an analysis in progress after a registry restart, and promotes it once', async () => {
    await register('5', buildTinyModel().bytes);
    const since = (await model()).rolloutHistory.length;
    const traffic = new Traffic(grpc);
    try {
      await registry.startAutoRollout({
        model: 'models/tiny',
        version: '5',
        analysis: { steps: [30, 100], intervalMs: 4_000n, minRequests: 40n, maxErrorRateIncrease: 0.01 },
      });
      await new Promise((r) => setTimeout(r, 1_500));
      expect((await model()).autoRollout).toMatchObject({ phase: AutoRolloutPhase.PROGRESSING, step: 0 });

      registry.close();
      await fixture.system.restart('registry');
      registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));

      const promoted = await waitForPhase(
        [AutoRolloutPhase.PROMOTED, AutoRolloutPhase.ROLLED_BACK, AutoRolloutPhase.ABORTED],
        90_000,
      );
      expect({ phase: AutoRolloutPhase[promoted.autoRollout!.phase], reason: promoted.autoRollout!.reason }).toEqual({
        phase: 'PROMOTED',
        reason: expect.any(String),
      });
      expect(decisions(promoted, since)).toEqual(['STARTED', 'ADVANCED', 'PROMOTED']);
    } finally {
      await traffic.stop();
    }
    expect(traffic.failures).toEqual([]);
    process.stdout.write(
      `registry restart: ${JSON.stringify(Object.fromEntries(traffic.served))} served, none failed\n`,
    );
  }, 240_000);
});

/**
 * The same judgement from Prometheus (the registry's PROMETHEUS_URL): Debian's prometheus scrapes
 * every service each second, and the routers report nothing to the registry (an interval of an
 * hour), so the canary's figures can only come from Prometheus.
 */
describe('automatic rollouts judged on Prometheus', () => {
  let fixture: Fixture;
  let prometheus: Prometheus;
  let dir: string;
  let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  let registry: Registry;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'infermesh-auto-rollout-prometheus-'));
    const [port] = await freePortList(1);
    fixture = await startFixture({
      models: ['tiny'],
      env: {
        ROUTER_CACHE_ENABLED: 'false',
        REGISTRY_ROLLOUT_TICK_MS: '500',
        ROUTER_TRAFFIC_REPORT_INTERVAL_MS: '3600000',
        PROMETHEUS_URL: `http://127.0.0.1:${port}`,
      },
    });
    const ports = fixture.system.options.ports;
    prometheus = startPrometheus(
      dir,
      port!,
      Object.fromEntries(SERVICE_NAMES.map((s) => [s, ports[`${s}Metrics`]])) as Record<ServiceName, number>,
    );
    await waitFor(
      'every target up',
      30_000,
      async () => {
        const list =
          (await promGet<{ activeTargets: Target[] }>(prometheus, '/api/v1/targets')).data?.activeTargets ?? [];
        return list.length === SERVICE_NAMES.length && list.every((t) => t.health === 'up') ? true : undefined;
      },
      () => prometheus.logTail(),
    );
    grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    await registry.setRolloutPolicy({ model: 'models/tiny', policy: { stableVersion: '1' } });
    const version = await registerModel(registry, 'tiny', '2', buildInputRangeModel(RANGE_ROWS).bytes);
    await waitForVersionsReady(registry, [version.name], 60_000);
  }, 120_000);

  afterAll(async () => {
    grpc?.close();
    registry?.close();
    if (prometheus !== undefined) await stopPrometheus(prometheus);
    await fixture?.stop();
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  it('rolls back a canary that fails on part of its inputs on the figures Prometheus scraped', async () => {
    const traffic = new Traffic(grpc);
    try {
      await registry.startAutoRollout({
        model: 'models/tiny',
        version: '2',
        analysis: { steps: [20, 100], intervalMs: 600_000n, minRequests: 40n, maxErrorRateIncrease: 0.01 },
      });
      const deadline = Date.now() + 60_000;
      let current = (await registry.getModel({ name: 'models/tiny' })).model!;
      while (current.autoRollout?.phase === AutoRolloutPhase.PROGRESSING && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 250));
        current = (await registry.getModel({ name: 'models/tiny' })).model!;
      }
      expect(current.autoRollout?.phase).toBe(AutoRolloutPhase.ROLLED_BACK);
      const verdict = current.rolloutHistory.at(-1)!;
      expect(verdict.figures!.canary!.requests).toBeGreaterThanOrEqual(40n);
      expect(verdict.figures!.stable!.requests).toBeGreaterThan(verdict.figures!.canary!.requests);
      expect(verdict.reason).toMatch(/^error_rate_increase gate failed/);
      process.stdout.write(`judged on Prometheus: ${verdict.reason}\n`);
    } finally {
      await traffic.stop();
    }
  }, 120_000);
});
