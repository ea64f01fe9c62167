import 'reflect-metadata';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import type { DynamicModule, INestApplicationContext, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Clock } from '@infermesh/clock';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type ReportTrafficRequest,
  type TrafficCounters,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RegistryWatch } from '@infermesh/registry-watch';
import { latencyIndex, ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually, type FakeRegistry, ManualClock, rpcRejection, startFakeRegistry } from '@infermesh/testing';
import { hostname } from 'node:os';
import { InferenceRouter } from './inference-router';
import { loadRouterConfig } from './router.config';
import { RouterModule } from './router.module';
import { FINAL_REPORT_TIMEOUT_MS, MAX_PENDING_VERSIONS, TrafficReporter } from './traffic-reporter';
import { BatcherAdapter, CacheAdapter, RegistryAdapter } from './upstreams.adapter';

// The registry is a real gRPC server (libs/testing's FakeRegistry: its WatchModels, and a
// ReportTraffic that records what it takes), reached through the router's own RegistryAdapter; the
// batcher, another service, is faked behind BatcherAdapter.

const signature = {
  inputs: [{ name: 'x', datatype: DataType.FP32, shape: [-1n, 4n] }],
  outputs: [{ name: 'y', datatype: DataType.FP32, shape: [-1n, 2n] }],
  maxBatchSize: 8,
};

const ready = (model: string, id: string) => ({
  name: `models/${model}/versions/${id}`,
  state: VersionState.READY,
  signature,
  artifact: { sha256: `sha256-of-${model}-${id}` },
});

/**
 * Runs requests the way a worker does, each row answered with class 0, unless the test says
 * otherwise for a version ("mlp/2"): errors its next calls throw, the time it takes (on the router's
 * ManualClock), or that it answers class 1 for every row after the first.
 */
class FakeBatcher {
  readonly requests: InferenceRequest[] = [];
  readonly failures = new Map<string, RpcError[]>();
  readonly durationsMs = new Map<string, number>();
  readonly disagreeing = new Set<string>();

  constructor(private readonly clock: ManualClock | undefined) {}

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    this.requests.push(request);
    const version = `${request.modelName}/${request.modelVersion}`;
    const durationMs = this.durationsMs.get(version);
    if (durationMs !== undefined) this.clock!.advance(durationMs);
    const failure = this.failures.get(version)?.shift();
    if (failure !== undefined) throw failure;
    const rows = Number(request.inputs[0]!.shape[0]);
    const scores = new Float32Array(rows * 2);
    for (let row = 0; row < rows; row++) scores[row * 2 + (row > 0 && this.disagreeing.has(version) ? 1 : 0)] = 1;
    return create(InferenceResponseSchema, {
      modelName: request.modelName,
      modelVersion: request.modelVersion,
      id: request.id,
      outputs: [{ name: 'y', datatype: DataType.FP32, shape: [BigInt(rows), 2n], data: new Uint8Array(scores.buffer) }],
    });
  }
}

const inferRequest = (modelName: string, modelVersion = '', rows = 1): InferenceRequest =>
  create(InferenceRequestSchema, {
    modelName,
    modelVersion,
    id: 'req',
    inputs: [{ name: 'x', datatype: DataType.FP32, shape: [BigInt(rows), 4n], data: new Uint8Array(16 * rows) }],
  });

/** The counters a report carries for a version, by its resource name. */
function countersIn(report: ReportTrafficRequest | undefined, name: string): TrafficCounters | undefined {
  return report?.versions.find((v) => v.name === name)?.counters;
}

const total = (counts: readonly bigint[]) => counts.reduce((sum, c) => sum + c, 0n);

describe(TrafficReporter.name, () => {
  let registry: FakeRegistry;
  /** The reports the registry took, in order. */
  let reports: ReportTrafficRequest[];
  /** ReportTraffic calls, taken or not. */
  let reportCalls: number;
  /** Errors the registry answers the next ReportTraffic calls with, one each. */
  let refusals: RpcError[];
  /** While set, ReportTraffic calls wait for it. */
  let hold: Promise<never> | undefined;
  let batcher: FakeBatcher;
  let logLines: string[];
  let app: INestApplicationContext | undefined;
  let router: InferenceRouter;
  let sut: TrafficReporter;

  beforeEach(async () => {
    reports = [];
    reportCalls = 0;
    refusals = [];
    hold = undefined;
    registry = await startFakeRegistry({
      handlers: {
        reportTraffic: async (request) => {
          reportCalls += 1;
          if (hold !== undefined) await hold;
          const refusal = refusals.shift();
          if (refusal !== undefined) throw refusal;
          reports.push(request);
          return {};
        },
      },
    });
    registry.put({ name: 'models/mlp', versions: [ready('mlp', '1'), ready('mlp', '2')] });
    // Every request to sh is served by version 1 and mirrored to version 2.
    registry.put({
      name: 'models/sh',
      versions: [ready('sh', '1'), ready('sh', '2')],
      rollout: { stableVersion: '1', shadow: { version: '2', percent: 100 } },
    });
  });

  afterEach(async () => {
    jest.restoreAllMocks();
    await app?.close();
    app = undefined;
    await registry.stop();
  });

  /**
   * Starts the router's Nest context against the fake registry; reports wait for report() unless the
   * env says an interval. Its time is `clock` when given (started at the real time: report deadlines
   * go to grpc-js, which keeps them on the real clock), else the system's.
   */
  async function start(env: Record<string, string> = {}, clock?: ManualClock): Promise<void> {
    batcher = new FakeBatcher(clock);
    logLines = [];
    const config = loadRouterConfig({
      ROUTER_LOG_LEVEL: 'error',
      ROUTER_REGISTRY_ADDRESS: registry.address,
      ROUTER_CACHE_ENABLED: 'false',
      ROUTER_RETRY_ATTEMPTS: '0',
      ROUTER_BREAKER_FAILURES: '1000',
      ROUTER_TRAFFIC_REPORT_INTERVAL_MS: '600000',
      ...env,
    });
    const module = RouterModule.forRoot(config);
    const replacements = new Map<Type, object>([
      [BatcherAdapter, batcher],
      [CacheAdapter, {}],
      [JsonLogger, new JsonLogger('router', 'warn', (line) => logLines.push(line))],
    ]);
    const withFakes: DynamicModule = {
      ...module,
      providers: [
        ...(module.providers ?? []).filter((p) => !replacements.has(p as Type)),
        ...[...replacements].map(([provide, useValue]) => ({ provide, useValue })),
        ...(clock === undefined ? [] : [{ provide: Clock, useValue: clock }]),
      ],
    };
    app = await NestFactory.createApplicationContext(withFakes, { logger: false, abortOnError: false });
    await app.get(RegistryWatch).ready();
    router = app.get(InferenceRouter);
    sut = app.get(TrafficReporter);
  }

  const warnings = () =>
    logLines
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter((e) => String(e['msg']).includes('traffic report'));

  it('reports per version the requests it answered, the service errors among them, and every failure but a cancellation', async () => {
    await start();
    for (let i = 0; i < 3; i++) await router.infer(inferRequest('mlp', '1'));
    batcher.failures.set('mlp/2', [
      Errors.upstreamUnavailable('the worker is gone'),
      new RpcError(status.INTERNAL, 'the model broke'),
      Errors.queueFull('the queue is full'),
      Errors.invalidRequest('a bad tensor'),
      new RpcError(status.CANCELLED, 'the client went away'),
    ]);
    for (let i = 0; i < 5; i++) await rpcRejection(router.infer(inferRequest('mlp', '2')));
    // Refused by the router itself once the version is known: the client's error, on version 2.
    await rpcRejection(router.infer(create(InferenceRequestSchema, { ...inferRequest('mlp', '2'), inputs: [] })));
    await router.infer(inferRequest('mlp', '2'));
    // No version serves these: nothing to report.
    await rpcRejection(router.infer(inferRequest('missing')));
    await rpcRejection(router.infer(inferRequest('mlp', '9')));

    await sut.report();

    expect(reports).toHaveLength(1);
    const [report] = reports;
    expect(report!.reporter).toBe(`router-${hostname()}-${process.pid}`);
    expect(report!.latencyBoundsSeconds).toEqual(ROLLOUT_LATENCY_BOUNDS_SECONDS);
    expect(report!.versions.map((v) => v.name).sort()).toEqual(['models/mlp/versions/1', 'models/mlp/versions/2']);
    expect(countersIn(report, 'models/mlp/versions/1')).toMatchObject({
      requests: 3n,
      errors: 0n,
      failures: 0n,
      shadowItems: 0n,
    });
    // Failures: the three service errors, the bad tensor, and the router's own refusal.
    expect(countersIn(report, 'models/mlp/versions/2')).toMatchObject({ requests: 7n, errors: 3n, failures: 5n });
  });

  it('counts the latency of successful requests only, under the bound of their duration', async () => {
    await start({}, new ManualClock(Date.now()));
    batcher.durationsMs.set('mlp/1', 30);
    batcher.durationsMs.set('mlp/2', 30);
    batcher.failures.set('mlp/2', [Errors.upstreamUnavailable('down'), Errors.upstreamUnavailable('down')]);
    for (let i = 0; i < 2; i++) await router.infer(inferRequest('mlp', '1'));
    for (let i = 0; i < 2; i++) await rpcRejection(router.infer(inferRequest('mlp', '2')));

    await sut.report();

    const one = countersIn(reports[0], 'models/mlp/versions/1')!;
    expect(one.latencyCounts).toHaveLength(ROLLOUT_LATENCY_BOUNDS_SECONDS.length + 1);
    expect(total(one.latencyCounts)).toBe(2n);
    // 30 ms each: both under the first bound of at least 30 ms.
    expect(one.latencyCounts[latencyIndex(0.03, ROLLOUT_LATENCY_BOUNDS_SECONDS)]).toBe(2n);
    const two = countersIn(reports[0], 'models/mlp/versions/2')!;
    expect(two).toMatchObject({ requests: 2n, errors: 2n });
    expect(total(two.latencyCounts)).toBe(0n);
  });

  it("counts the shadow's compared and agreed items under the shadow version, its requests under the served one", async () => {
    await start();
    // Version 2 gives another top class for every row after the first: of 3 rows, 1 agrees.
    batcher.disagreeing.add('sh/2');
    for (let i = 0; i < 2; i++) await router.infer(inferRequest('sh', '', 3));
    await eventually(() => batcher.requests.length === 4);
    await new Promise((r) => setImmediate(r));

    await sut.report();

    expect(countersIn(reports[0], 'models/sh/versions/2')).toMatchObject({
      requests: 0n,
      shadowItems: 6n,
      shadowAgreed: 2n,
    });
    expect(countersIn(reports[0], 'models/sh/versions/1')).toMatchObject({
      requests: 2n,
      shadowItems: 0n,
      shadowAgreed: 0n,
    });
  });

  it('carries the counts of a refused report into the next, and warns at most once a minute', async () => {
    const clock = new ManualClock(Date.now());
    await start({}, clock);
    refusals.push(
      new RpcError(status.UNIMPLEMENTED, 'ReportTraffic is not served'),
      Errors.upstreamUnavailable('the registry is restarting'),
    );
    await router.infer(inferRequest('mlp', '1'));
    await sut.report();
    await router.infer(inferRequest('mlp', '1'));
    await router.infer(inferRequest('mlp', '2'));
    await sut.report();
    expect([reportCalls, reports.length]).toEqual([2, 0]);
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]).toMatchObject({
      level: 'warn',
      msg: expect.stringContaining('does not take traffic reports'),
    });

    await router.infer(inferRequest('mlp', '2'));
    await sut.report();

    expect(reports).toHaveLength(1);
    expect(countersIn(reports[0], 'models/mlp/versions/1')).toMatchObject({ requests: 2n });
    expect(countersIn(reports[0], 'models/mlp/versions/2')).toMatchObject({ requests: 2n });
    expect(total(countersIn(reports[0], 'models/mlp/versions/1')!.latencyCounts)).toBe(2n);
    // Taken: the next report starts from zero.
    await router.infer(inferRequest('mlp', '2'));
    await sut.report();
    expect(reports[1]!.versions.map((v) => [v.name, v.counters?.requests])).toEqual([['models/mlp/versions/2', 1n]]);

    // A minute after the last warning, a refusal is logged again, with those refused since.
    refusals.push(Errors.upstreamUnavailable('down'), Errors.upstreamUnavailable('down'));
    await router.infer(inferRequest('mlp', '1'));
    await sut.report();
    expect(warnings()).toHaveLength(1);
    clock.advance(61_000);
    await sut.report();
    expect(warnings()).toHaveLength(2);
    expect(warnings()[1]).toMatchObject({ refused_reports: 3, pending_versions: 1 });
  });

  it('keeps the counts while the registry is down and reports them once it is back', async () => {
    await start();
    const port = registry.port;
    await router.infer(inferRequest('mlp', '1'));
    await registry.stop();
    await sut.report();
    await router.infer(inferRequest('mlp', '1'));
    await sut.report();
    await registry.start(port);

    // Until the router's channel has reconnected: each refused report keeps the counts.
    await eventually(
      async () => {
        await sut.report();
        return reports.length > 0;
      },
      10_000,
      100,
    );

    expect(reports).toHaveLength(1);
    expect(countersIn(reports[0], 'models/mlp/versions/1')).toMatchObject({ requests: 2n });
  });

  it('sends nothing while nothing was counted, and reports what was every ROUTER_TRAFFIC_REPORT_INTERVAL_MS', async () => {
    const clock = new ManualClock(Date.now());
    await start({ ROUTER_TRAFFIC_REPORT_INTERVAL_MS: '20' }, clock);
    const sent = jest.spyOn(app!.get(RegistryAdapter), 'reportTraffic');
    for (let i = 0; i < 10; i++) clock.advance(20);
    expect(sent).not.toHaveBeenCalled();

    await router.infer(inferRequest('mlp', '1'));
    clock.advance(19);
    expect(sent).not.toHaveBeenCalled();
    clock.advance(1);
    expect(sent).toHaveBeenCalledTimes(1);
    await eventually(() => reports.length === 1);
    for (let i = 0; i < 10; i++) clock.advance(20);

    expect(sent).toHaveBeenCalledTimes(1);
    expect(reportCalls).toBe(1);
    expect(countersIn(reports[0], 'models/mlp/versions/1')).toMatchObject({ requests: 1n });
  });

  it('sends the last counts when the router shuts down', async () => {
    await start();
    await router.infer(inferRequest('mlp', '1'));
    await router.infer(inferRequest('mlp', '2'));
    expect(reportCalls).toBe(0);

    await app!.close();
    app = undefined;

    expect(reports).toHaveLength(1);
    expect(reports[0]!.versions.map((v) => [v.name, v.counters?.requests]).sort()).toEqual([
      ['models/mlp/versions/1', 1n],
      ['models/mlp/versions/2', 1n],
    ]);
  });

  it('shuts down within its deadline when the registry does not answer', async () => {
    const clock = new ManualClock(Date.now());
    await start({}, clock);
    hold = new Promise<never>(() => undefined);
    await router.infer(inferRequest('mlp', '1'));
    const before = sut.report();
    await eventually(() => reportCalls === 1);
    await router.infer(inferRequest('mlp', '2'));

    let closed = false;
    const closing = app!.close().then(() => (closed = true));
    app = undefined;
    // The report on its way gets FINAL_REPORT_TIMEOUT_MS; then there is no time left for the last one.
    await eventually(() => clock.pendingInMs().includes(FINAL_REPORT_TIMEOUT_MS));
    clock.advance(FINAL_REPORT_TIMEOUT_MS - 1);
    await new Promise((resolve) => setImmediate(resolve));
    expect(closed).toBe(false);
    clock.advance(1);
    await closing;

    expect(reportCalls).toBe(1);
    await before; // the held call ends at its deadline, which grpc-js keeps on the real clock
  });

  it(`keeps the counts of at most ${MAX_PENDING_VERSIONS} versions, dropping the oldest, counted`, async () => {
    await start();
    for (let v = 1; v <= MAX_PENDING_VERSIONS + 3; v++) sut.failed(`models/m/versions/${v}`, status.INTERNAL);
    sut.failed('models/m/versions/5', status.INTERNAL);

    await sut.report();

    const names = reports[0]!.versions.map((v) => v.name);
    expect(names).toHaveLength(MAX_PENDING_VERSIONS);
    expect(names.slice(0, 2)).toEqual(['models/m/versions/4', 'models/m/versions/5']);
    expect(countersIn(reports[0], 'models/m/versions/5')).toMatchObject({ requests: 2n, errors: 2n });
    const dropped = app!
      .get(Metrics)
      .registry.getSingleMetric('infermesh_router_traffic_report_dropped_versions_total');
    expect((await dropped!.get()).values[0]!.value).toBe(3);
  });
});
