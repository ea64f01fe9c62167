import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { eventually } from '@infermesh/testing';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ServiceName } from './service-process';
import { DEFAULT_PORTS, defaultPorts, System, type SystemOptions, WORKER_MALLOC_ENV } from './system';

/** A stand-in worker entry that prints the variables a worker is placed and addressed by. */
const WORKER_SCRIPT = `
for (const key of ['WORKER_ID', 'WORKER_MODELS', 'WORKER_GRPC_PORT', 'WORKER_ARTIFACT_DIR']) console.log(key + '=' + process.env[key]);
setInterval(() => undefined, 1000);
`;

describe(System.name, () => {
  let distDir: string;
  let lines: [ServiceName, string, number | undefined][];
  let sut: System | undefined;

  const options = (more: Partial<SystemOptions> = {}): SystemOptions => ({
    distDir,
    dataDir: '/data',
    apiKey: 'key',
    ports: DEFAULT_PORTS,
    sink: (service, line, instance) => lines.push([service, line, instance]),
    models: [],
    ...more,
  });
  const twoWorkers = () =>
    options({
      ports: { ...DEFAULT_PORTS, moreWorkers: [{ grpc: 50065, metrics: 9115 }] },
      workers: [{ models: ['primary'] }, { models: ['backup', 'other'] }],
    });

  beforeAll(() => {
    distDir = mkdtempSync(join(tmpdir(), 'system-'));
    mkdirSync(join(distDir, 'services', 'worker', 'src'), { recursive: true });
    writeFileSync(join(distDir, 'services', 'worker', 'src', 'main.js'), WORKER_SCRIPT);
  });

  beforeEach(() => {
    lines = [];
  });

  afterEach(async () => {
    await sut?.stop();
    sut = undefined;
  });

  afterAll(() => {
    rmSync(distDir, { recursive: true, force: true });
  });

  it('runs one worker serving every model by default, the batcher dispatching to it alone', () => {
    sut = new System(options());

    expect(sut.workerProcesses).toHaveLength(1);
    expect(sut.workerProcess(0)).toBe(sut.process('worker'));
    expect(sut.envFor('worker')).toMatchObject({
      WORKER_GRPC_PORT: '50055',
      WORKER_METRICS_PORT: '9105',
      WORKER_ARTIFACT_DIR: '/data/worker-artifacts',
    });
    expect(sut.envFor('worker')['WORKER_MODELS']).toBeUndefined();
    expect(sut.envFor('batcher')['BATCHER_WORKER_ADDRESSES']).toBe('127.0.0.1:50055');
    expect(() => sut!.workerProcess(1)).toThrow(/no worker 1: the system runs 1/);
  });

  it('gives each worker its own ports, WORKER_ID, artifact directory and placement, and the batcher every address', () => {
    sut = new System(twoWorkers());

    expect(sut.workerProcess(0)).toBe(sut.process('worker'));
    expect(sut.envForWorker(0)).toMatchObject({
      WORKER_ID: 'worker-0',
      WORKER_MODELS: 'primary',
      WORKER_GRPC_PORT: '50055',
      WORKER_METRICS_PORT: '9105',
      WORKER_ARTIFACT_DIR: '/data/worker-artifacts',
    });
    expect(sut.envForWorker(1)).toMatchObject({
      WORKER_ID: 'worker-1',
      WORKER_MODELS: 'backup,other',
      WORKER_GRPC_PORT: '50065',
      WORKER_METRICS_PORT: '9115',
      WORKER_ARTIFACT_DIR: '/data/worker-artifacts-1',
      WORKER_REGISTRY_ADDRESS: '127.0.0.1:50051',
    });
    expect(sut.envFor('batcher')['BATCHER_WORKER_ADDRESSES']).toBe('127.0.0.1:50055,127.0.0.1:50065');
    expect(sut.workerGrpcAddress(1)).toBe('127.0.0.1:50065');
    expect(sut.workerMetricsUrl(1)).toBe('http://127.0.0.1:9115/metrics');
  });

  it('refuses more workers than SystemPorts has ports for', () => {
    expect(() => new System(options({ workers: [{}, {}] }))).toThrow(
      /2 workers need the ports of 1 more in SystemPorts.moreWorkers; it has 0/,
    );
    expect(() => new System(options({ workers: [] }))).toThrow(/at least one worker/);
  });

  it('starts a worker with its own environment and passes its log lines on with its index', async () => {
    sut = new System(twoWorkers());

    sut.workerProcess(1).start();
    await eventually(() => lines.length === 4);

    expect(lines).toEqual([
      ['worker', 'WORKER_ID=worker-1', 1],
      ['worker', 'WORKER_MODELS=backup,other', 1],
      ['worker', 'WORKER_GRPC_PORT=50065', 1],
      ['worker', 'WORKER_ARTIFACT_DIR=/data/worker-artifacts-1', 1],
    ]);
    expect(sut.workerProcess(0).running).toBe(false);
    await sut.workerProcess(1).kill();
    expect(sut.workerProcess(1).running).toBe(false);
  });
});

describe('WORKER_MALLOC_ENV', () => {
  it("is in every worker's environment unless the environment sets it, and in no other service's", () => {
    const system = (env?: Record<string, string>) =>
      new System({
        distDir: '/dist',
        dataDir: '/data',
        apiKey: 'key',
        ports: DEFAULT_PORTS,
        sink: () => undefined,
        models: [],
        ...(env !== undefined && { env }),
      });
    const sut = system();
    expect(sut.envForWorker(0)).toMatchObject(WORKER_MALLOC_ENV);
    for (const name of ['registry', 'cache', 'batcher', 'router', 'gateway'] as const) {
      for (const variable of Object.keys(WORKER_MALLOC_ENV))
        expect(sut.envFor(name)[variable]).toBe(process.env[variable]);
    }

    expect(system({ MALLOC_MMAP_THRESHOLD_: '65536' }).envForWorker(0)['MALLOC_MMAP_THRESHOLD_']).toBe('65536');
  });

  it("is what the worker's Deployment and the GPU image set", () => {
    const root = join(__dirname, '..', '..', '..');
    const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8').replace(/\\\n\s*/g, ' '); // continuation lines joined
    const gpuStage = dockerfile.split(/^FROM /m).find((stage) => / AS worker-gpu$/m.test(stage.split('\n')[0]!))!;
    const imageEnv = gpuStage
      .split('\n')
      .filter((line) => line.startsWith('ENV '))
      .flatMap((line) => line.slice(4).trim().split(/\s+/));
    const deployment = readFileSync(join(root, 'k8s', 'base', 'worker.yaml'), 'utf8');
    for (const [name, value] of Object.entries(WORKER_MALLOC_ENV)) {
      expect(imageEnv).toContain(`${name}=${value}`);
      expect(deployment).toContain(`- { name: ${name}, value: "${value}" }`);
    }
  });
});

describe('defaultPorts', () => {
  it('gives each worker after the first its own gRPC and metrics ports, 10 apart, clear of every other port', () => {
    expect(defaultPorts(1)).toBe(DEFAULT_PORTS);
    const sut = defaultPorts(3);

    expect(sut.moreWorkers).toEqual([
      { grpc: 50065, metrics: 9115 },
      { grpc: 50075, metrics: 9125 },
    ]);
    const all = [...Object.values(DEFAULT_PORTS), ...sut.moreWorkers!.flatMap((w) => [w.grpc, w.metrics])];
    expect(new Set(all).size).toBe(all.length);
  });
});
