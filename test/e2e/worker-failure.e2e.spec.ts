import { createClient } from '@infermesh/grpc';
import { RegistryService, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { serviceEntry, ServiceProcess } from '@infermesh/system';
import { API_KEY, DIST, type Fixture, metricValue, startFixture } from './support/system-fixture';

const LOOPS = 4;

/**
 * Two workers serving the tiny model while clients keep sending. Worker 1 is replaced by one that can
 * only use CUDA, which this host lacks, so it fails to load the model. One worker's failure must not take the version from the worker that serves it: the registry keeps it READY while any
 * worker has it READY (a FAILED version would send every request to 503).
 */
describe('one of two workers failing to load a version', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      workers: [{}, {}],
      env: { ROUTER_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  /** Runs `disturb` while clients send and the version's state is watched; the failures and states seen. */
  async function underLoad(disturb: () => Promise<void>) {
    const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    const failures: string[] = [];
    const statesSeen = new Set<string>();
    let served = 0;
    let stop = false;
    let seq = 0;
    const loop = async () => {
      while (!stop) {
        seq += 1;
        const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
          method: 'POST',
          headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
          body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [seq, 1, 2, 3] }] }),
          signal: AbortSignal.timeout(20_000),
        });
        const body = (await res.json()) as { error?: string };
        if (res.status === 200) served += 1;
        else failures.push(`${res.status} ${body.error}`);
      }
    };
    const watchState = async () => {
      while (!stop) {
        const { model } = await registry.getModel({ name: 'models/tiny' });
        statesSeen.add(VersionState[model!.versions[0]!.state] ?? 'unknown');
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    try {
      const running = [...Array.from({ length: LOOPS }, loop), watchState()];
      await new Promise((r) => setTimeout(r, 1_000));
      await disturb();
      await new Promise((r) => setTimeout(r, 3_000));
      stop = true;
      await Promise.all(running);
    } finally {
      stop = true;
      registry.close();
    }
    return { requests: served + failures.length, failures, statesSeen: [...statesSeen] };
  }

  it('keeps the version READY when worker 1 fails to load it, and fails no request', async () => {
    let replacement: ServiceProcess | undefined;
    const run = await underLoad(async () => {
      // Worker 1, with the same id and ports, comes back able to use CUDA only: it loads the version
      // ahead of requests, fails, and reports FAILED while worker 0 has it READY.
      await fixture.system.workerProcess(1).kill();
      replacement = new ServiceProcess(
        'worker',
        serviceEntry(DIST, 'worker'),
        { ...fixture.system.envForWorker(1), WORKER_EXECUTION_PROVIDERS: 'cuda' },
        () => undefined,
      );
      replacement.start();
    });
    const failedLoads = await metricValue(fixture.system.workerMetricsUrl(1), 'infermesh_worker_model_loads_total', {
      outcome: 'failed',
    });
    await replacement?.stop();

    console.log(
      `worker 1 failed to load tiny while worker 0 served it: ${run.requests} requests, ${run.failures.length} failed; version states seen: ${run.statesSeen.join(', ')}`,
    );
    expect(run.failures).toEqual([]);
    expect(run.statesSeen).toEqual(['READY']);
    expect(failedLoads).toBeGreaterThan(0);
  }, 60_000);
});
