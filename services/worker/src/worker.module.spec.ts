import { status } from '@grpc/grpc-js';
import { createClient, RpcError } from '@infermesh/grpc';
import { Health, HealthCheckResponse_ServingStatus } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { bind, bootstrap, type RunningService } from '@infermesh/runtime';
import { Metrics } from '@infermesh/telemetry';
import { freePort } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadWorkerConfig } from './worker.config';
import { WorkerGrpcController } from './worker.grpc';
import { WorkerModule } from './worker.module';

describe(WorkerModule.name, () => {
  let dir: string;
  let sut: RunningService;
  let address: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'worker-'));
    const config = loadWorkerConfig({
      WORKER_GRPC_PORT: '0',
      WORKER_METRICS_PORT: '0',
      WORKER_LOG_LEVEL: 'error',
      WORKER_ID: 'worker-under-test',
      // Nothing listens there: the registry is down for the whole test.
      WORKER_REGISTRY_ADDRESS: `127.0.0.1:${await freePort()}`,
      WORKER_ARTIFACT_DIR: dir,
      WORKER_SYNC_INTERVAL_MS: '50',
    });
    sut = await bootstrap({
      module: WorkerModule.forRoot(config),
      grpc: (app) => [bind(WorkerService, app.get(WorkerGrpcController))],
    });
    address = `127.0.0.1:${sut.grpcPort}`;
  });
  afterAll(async () => {
    await sut?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('starts SERVING and keeps answering while the registry is down', async () => {
    const health = createClient(Health, address);
    const worker = createClient(WorkerService, address);
    try {
      await new Promise((r) => setTimeout(r, 300)); // several sync intervals against the dead registry
      expect((await health.check({ service: '' })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
      expect((await health.check({ service: WorkerService.typeName })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
      expect(await worker.listModels({})).toMatchObject({ workerId: 'worker-under-test', models: [] });
      const error = await worker.infer({ request: { modelName: 'tiny', modelVersion: '1' } }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(RpcError);
      expect([(error as RpcError).code, (error as RpcError).reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
      const metrics = await sut.app.get(Metrics).render();
      expect(metrics).toMatch(/infermesh_worker_registry_sync_failures_total [1-9]/);
      expect(metrics).toMatch(/infermesh_worker_models_loaded 0/);
    } finally {
      health.close();
      worker.close();
    }
  });
});

describe(loadWorkerConfig.name, () => {
  it('applies the defaults', () => {
    const sut = loadWorkerConfig({});
    expect(sut).toMatchObject({
      registryAddress: '127.0.0.1:50051',
      executionProviders: ['cuda', 'cpu'],
      syncIntervalMs: 1000,
      intraOpThreads: 1,
      runtime: { grpc: { port: 50055 }, metrics: { port: 9105 } },
    });
    expect(sut.workerId).toMatch(new RegExp(`-${process.pid}$`));
    expect(sut.artifactDir).toMatch(/\.infermesh\/worker-artifacts$/);
  });

  it('names the variable that is wrong', () => {
    expect(() => loadWorkerConfig({ WORKER_EXECUTION_PROVIDERS: ' , ' })).toThrow(/WORKER_EXECUTION_PROVIDERS/);
    expect(() => loadWorkerConfig({ WORKER_REGISTRY_ADDRESS: 'nowhere' })).toThrow(/WORKER_REGISTRY_ADDRESS/);
  });
});
