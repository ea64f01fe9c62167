import { DEFAULT_RESTART_POLICY } from '@infermesh/system';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type Fixture, inferTinyDistinct, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

/**
 * Two batchers behind the router's `xds:///batcher`, one killed by SIGKILL under load. Only the
 * mesh retries (the router's own retries are off): the policy's retry of UNAVAILABLE on another
 * endpoint, and the instance withdrawn from the endpoints once its announcement breaks.
 */
describe('one of two batchers killed under load, in the mesh', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: join(REPO_ROOT, 'envoy', 'mesh.yaml'),
      replicas: { batcher: [{}, {}] },
      restartPolicy: DEFAULT_RESTART_POLICY,
      env: { ROUTER_RETRY_ATTEMPTS: '0', ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  it('loses no request of 16 closed-loop clients over 20 s, and the restarted batcher takes calls again', async () => {
    const victim = fixture.system.instance('batcher', 1);
    const pid = victim.pid!;
    const statuses: number[] = [];
    const end = Date.now() + 20_000;
    const clients = Array.from({ length: 16 }, async () => {
      while (Date.now() < end) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    await new Promise((r) => setTimeout(r, 5_000));
    process.kill(pid, 'SIGKILL');
    await Promise.all(clients);

    const failed = statuses.filter((s) => s !== 200);
    const dispatchedByRestarted = await metricValue(
      fixture.system.instanceMetricsUrl('batcher', 1),
      'infermesh_batcher_dispatched_total',
    );
    console.log(
      `two batchers, one killed by SIGKILL 5 s in: ${statuses.length} requests at c=16 over 20 s, ${failed.length} failed (${[...new Set(failed)].join(', ')}); the restarted batcher dispatched ${dispatchedByRestarted}`,
    );
    expect(failed).toEqual([]);
    expect(victim.pid).not.toBe(pid);
    expect(dispatchedByRestarted).toBeGreaterThan(0);
  }, 90_000);
});

describe('one of two workers killed under load, in the mesh', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: join(REPO_ROOT, 'envoy', 'mesh.yaml'),
      workers: [{}, {}],
      restartPolicy: DEFAULT_RESTART_POLICY,
      env: { ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  it('loses no request of 16 closed-loop clients over 30 s; the batcher drops the dead worker and takes it back once restarted', async () => {
    const victim = fixture.system.workerProcess(0);
    const pid = victim.pid!;
    const statuses: number[] = [];
    const end = Date.now() + 30_000;
    const clients = Array.from({ length: 16 }, async () => {
      while (Date.now() < end) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    await new Promise((r) => setTimeout(r, 5_000));
    process.kill(pid, 'SIGKILL');
    // From the moment the restarted worker is announced and serving, until it has run a batch.
    let announcedAt: number | undefined;
    let servingAgainAt: number | undefined;
    while (Date.now() < end && servingAgainAt === undefined) {
      if (
        announcedAt === undefined &&
        victim.pid !== pid &&
        (await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_mesh_instances', {
          service: 'worker',
          serving: 'true',
        })) === 2
      ) {
        announcedAt = Date.now();
      }
      if (
        announcedAt !== undefined &&
        (await metricValue(fixture.system.workerMetricsUrl(0), 'infermesh_worker_inference_batch_size_count').catch(
          () => 0,
        )) > 0
      )
        servingAgainAt = Date.now();
      await new Promise((r) => setTimeout(r, 100));
    }
    await Promise.all(clients);

    const failed = statuses.filter((s) => s !== 200);
    const batchesByRestarted = await metricValue(
      fixture.system.workerMetricsUrl(0),
      'infermesh_worker_inference_batch_size_count',
    );
    const log = readFileSync(fixture.logFile, 'utf8');
    const servedAfterMs =
      announcedAt === undefined || servingAgainAt === undefined ? undefined : servingAgainAt - announcedAt;
    console.log(
      `mesh: two workers, one killed by SIGKILL 5 s in: ${statuses.length} requests at c=16 over 30 s, ${failed.length} failed; ` +
        `the restarted worker ran its first batch ${servedAfterMs} ms after it was announced, ${batchesByRestarted} batches in all`,
    );
    expect(servedAfterMs).toBeLessThanOrEqual(10_000);
    expect(failed).toEqual([]);
    expect(log).toMatch(/worker 127\.0\.0\.1:\d+ left the mesh/);
    expect(victim.pid).not.toBe(pid);
    expect(batchesByRestarted).toBeGreaterThan(0);
  }, 90_000);
});
