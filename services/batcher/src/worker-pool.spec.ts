import { type Env } from '@infermesh/config';
import { configureTransportSecurity, GrpcServer, type TransportSecurity, Errors } from '@infermesh/grpc';
import { LocalCa, writeIdentityFiles } from '@infermesh/identity';
import { type AnnouncedInstance, InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { MeshXds } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { ManualClock } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadBatcherConfig } from './batcher.config';
import { WorkerPool, workerClientOptions } from './worker-pool';

const IDENTITY_DIR = '/var/run/infermesh/identity';
const runtimeOf = (env: Env) => loadBatcherConfig(env).runtime;
const MESH = { BATCHER_WORKER_ADDRESSES: 'mesh', INFERMESH_MESH_CONTROL_PLANE: '127.0.0.1:50051' };

describe(workerClientOptions.name, () => {
  const LIMITS = { maxMessageBytes: 64 * 1024 * 1024 };

  it("leaves the process's own transport security without a sidecar, as before", () => {
    expect(workerClientOptions(runtimeOf({}))).toStrictEqual(LIMITS);
    expect(workerClientOptions(runtimeOf(MESH))).toStrictEqual(LIMITS);
    expect(workerClientOptions(runtimeOf({ ...MESH, INFERMESH_TLS_DIR: IDENTITY_DIR }))).toStrictEqual(LIMITS);
  });

  it('carries messages of up to BATCHER_MAX_MESSAGE_BYTES, as the batcher receives them', () => {
    expect(workerClientOptions(runtimeOf({ BATCHER_MAX_MESSAGE_BYTES: '1000000' }))).toStrictEqual({
      maxMessageBytes: 1_000_000,
    });
  });

  it("behind a sidecar, presents the instance's identity and requires a worker's: the workers' sidecars speak mutual TLS", () => {
    expect(
      workerClientOptions(runtimeOf({ ...MESH, INFERMESH_SIDECAR_PORT: '15006', INFERMESH_TLS_DIR: IDENTITY_DIR })),
    ).toStrictEqual({
      ...LIMITS,
      peer: 'worker',
      transport: {
        certFile: `${IDENTITY_DIR}/cert.pem`,
        keyFile: `${IDENTITY_DIR}/key.pem`,
        caFile: `${IDENTITY_DIR}/ca.pem`,
        trustDomain: 'infermesh.local',
        refreshMs: 30_000,
      },
    });
  });

  it('behind a sidecar without an identity (a mesh without mutual TLS), dials the workers in plaintext, not with the process default', () => {
    expect(workerClientOptions(runtimeOf({ ...MESH, INFERMESH_SIDECAR_PORT: '15006' }))).toStrictEqual({
      ...LIMITS,
      peer: 'worker',
      transport: null,
    });
  });
});

/**
 * The batcher behind its sidecar (the process in plaintext) reaching the workers the control plane
 * lists, each at its sidecar's inbound port, which requires mutual TLS: here, fakes served over real
 * sockets with certificates of a local CA.
 */
describe('WorkerPool behind a sidecar', () => {
  let root: string;
  let batcherDir: string;
  const servers: GrpcServer[] = [];
  let listed: AnnouncedInstance[] = [];
  let controlPlane: string;
  let pool: WorkerPool | undefined;
  const logger = new JsonLogger('batcher', 'error', () => undefined);

  const identityOf = (dir: string): TransportSecurity => ({
    certFile: join(dir, 'cert.pem'),
    keyFile: join(dir, 'key.pem'),
    caFile: join(dir, 'ca.pem'),
    trustDomain: 'infermesh.local',
    refreshMs: 30_000,
  });

  /** A worker's sidecar inbound port as the batcher meets it: mutual TLS, with the certificate of `service`. */
  async function workerSidecar(ca: LocalCa, service: string): Promise<number> {
    const dir = join(root, service);
    await writeIdentityFiles(dir, await ca.issue({ service, instance: `${service}-0` }, 3_600_000), ca.bundlePem);
    const server = new GrpcServer({ logger, metrics: new Metrics('fake_worker'), maxMessageBytes: 1 << 20 });
    server.add(
      WorkerService,
      {
        listModels: async () => ({ workerId: `${service}-0`, models: [], placedModels: [] }),
        infer: () => Promise.reject(Errors.invalidRequest('not in this test')),
        loadModel: () => Promise.reject(Errors.invalidRequest('not in this test')),
        unloadModel: () => Promise.reject(Errors.invalidRequest('not in this test')),
      },
      { infers: 'infer' },
    );
    // The server takes the process's credentials when it binds; the batcher's process then goes back to plaintext.
    configureTransportSecurity(identityOf(dir));
    try {
      const port = await server.listen('127.0.0.1', 0);
      servers.push(server);
      return port;
    } finally {
      configureTransportSecurity(undefined);
    }
  }

  let workerPort: number;
  let impostorPort: number;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'worker-pool-'));
    const ca = await LocalCa.open(join(root, 'ca'));
    batcherDir = join(root, 'batcher');
    await writeIdentityFiles(
      batcherDir,
      await ca.issue({ service: 'batcher', instance: 'batcher-0' }, 3_600_000),
      ca.bundlePem,
    );
    workerPort = await workerSidecar(ca, 'worker');
    impostorPort = await workerSidecar(ca, 'router');
    const directory = new GrpcServer({ logger, metrics: new Metrics('fake_control_plane'), maxMessageBytes: 1 << 20 });
    directory.add(InstanceService, {
      listInstances: async () => ({ instances: listed }),
      announce: () => Promise.reject(Errors.invalidRequest('not in this test')),
    });
    controlPlane = `127.0.0.1:${await directory.listen('127.0.0.1', 0)}`;
    servers.push(directory);
  });

  afterEach(() => {
    pool?.onApplicationShutdown();
    pool = undefined;
  });

  afterAll(async () => {
    await Promise.all(servers.map((server) => server.shutdown(1)));
    rmSync(root, { recursive: true, force: true });
  });

  /** Whether the worker the control plane lists at `port` answered the pool's poll. */
  async function reachable(port: number, env: Env): Promise<boolean> {
    listed = [
      {
        instance: { service: 'worker', id: 'worker-0', address: '127.0.0.1', port, labels: {} },
        serving: true,
      } as AnnouncedInstance,
    ];
    const config = loadBatcherConfig({
      ...env,
      BATCHER_WORKER_ADDRESSES: 'mesh',
      INFERMESH_MESH_CONTROL_PLANE: controlPlane,
      INFERMESH_SIDECAR_PORT: '15006',
    });
    const metrics = new Metrics('batcher');
    pool = new WorkerPool(
      config,
      logger,
      metrics,
      new MeshXds('batcher', undefined, logger, metrics),
      new ManualClock(),
    );
    await pool.refresh();
    expect(pool.workers.map((w) => w.address)).toEqual([`127.0.0.1:${port}`]);
    return pool.workers[0]!.reachable;
  }

  it("reaches a worker's sidecar with the instance's identity", async () => {
    await expect(reachable(workerPort, { INFERMESH_TLS_DIR: batcherDir })).resolves.toBe(true);
  });

  it('is refused by it without one: plaintext does not pass mutual TLS', async () => {
    await expect(reachable(workerPort, {})).resolves.toBe(false);
  });

  it('refuses a listed port that proves to be another service', async () => {
    await expect(reachable(impostorPort, { INFERMESH_TLS_DIR: batcherDir })).resolves.toBe(false);
  });
});
