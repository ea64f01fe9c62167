import { DEFAULT_RESTART_POLICY, type ServiceName } from '@infermesh/system';
import { freePortList } from '@infermesh/testing';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { DIST, type Fixture, inferTinyDistinct, metricValue, startFixture } from './support/system-fixture';

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('services under a supervisor', () => {
  it('shut down when the supervisor dies, even by SIGKILL, instead of living on as orphans', async () => {
    const [grpcPort, metricsPort] = await freePortList(2);
    // A stand-in for `infermesh up`: starts the cache service through ServiceProcess, prints its pid.
    const script = `
      const { ServiceProcess, serviceEntry } = require(${JSON.stringify(join(DIST, 'node_modules', '@infermesh', 'system'))});
      const env = { ...process.env, CACHE_GRPC_PORT: '${grpcPort}', CACHE_METRICS_PORT: '${metricsPort}' };
      const service = new ServiceProcess('cache', serviceEntry(${JSON.stringify(DIST)}, 'cache'), env, (_name, line) => {
        if (line.includes('cache listening')) console.log('PID ' + service.pid);
      });
      service.start();
      setInterval(() => {}, 1000);
    `;
    const supervisor = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    const servicePid = await new Promise<number>((resolve, reject) => {
      supervisor.stdout.on('data', (chunk: Buffer) => {
        const match = /PID (\d+)/.exec(chunk.toString());
        if (match) resolve(Number(match[1]));
      });
      supervisor.once('exit', () => reject(new Error('the supervisor exited before the service listened')));
    });
    expect(alive(servicePid)).toBe(true);

    supervisor.kill('SIGKILL');
    const deadline = Date.now() + 20_000;
    while (alive(servicePid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect(alive(servicePid)).toBe(false);
  });
});

describe('a system supervised as `infermesh up` supervises it', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({ models: ['tiny'], restartPolicy: DEFAULT_RESTART_POLICY });
  });

  afterAll(async () => {
    await fixture?.stop();
  });

  const infer = () => inferTinyDistinct(fixture.system.gatewayUrl);

  it.each<ServiceName>(['worker', 'gateway', 'router'])(
    'starts the %s again after a kill -9 from outside, and the system serves again without anyone restarting it',
    async (service) => {
      const victim = fixture.system.process(service);
      const pid = victim.pid!;
      const restartsBefore = victim.restartCount;
      expect(await infer()).toBe(200);

      process.kill(pid, 'SIGKILL');
      const deadline = Date.now() + 60_000;
      let status = await infer();
      while ((victim.pid === pid || status !== 200) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        status = await infer();
      }

      if (status !== 200) throw new Error(`no 200 after the ${service} was killed\n${fixture.logTail()}`);
      expect(victim.state).toBe('running');
      expect(victim.pid).not.toBe(pid);
      expect(victim.restartCount).toBe(restartsBefore + 1);
      expect(readFileSync(fixture.logFile, 'utf8')).toContain(
        `supervisor | ${service} exited unexpectedly (killed by SIGKILL after`,
      );
      // Once back, it keeps serving: ten in a row.
      const after = await Promise.all(Array.from({ length: 10 }, () => infer()));
      expect(after).toEqual(Array(10).fill(200));
    },
  );
});

describe('one of two workers killed under load, supervised as `infermesh up` supervises it', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      workers: [{}, {}],
      restartPolicy: DEFAULT_RESTART_POLICY,
      env: { ROUTER_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  it('loses no request of 16 closed-loop clients over 30 s, and the killed worker serves again once restarted', async () => {
    const victim = fixture.system.workerProcess(0);
    const pid = victim.pid!;
    const statuses: number[] = [];
    let killedAt = 0;
    const end = Date.now() + 30_000;
    const clients = Array.from({ length: 16 }, async () => {
      while (Date.now() < end) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    await new Promise((r) => setTimeout(r, 5_000));
    process.kill(pid, 'SIGKILL');
    killedAt = Date.now();
    await Promise.all(clients);

    const failed = statuses.filter((s) => s !== 200);
    const servedByRestarted = await metricValue(
      fixture.system.workerMetricsUrl(0),
      'infermesh_worker_inference_batch_size_count',
    );
    console.log(
      `two workers, one killed by SIGKILL ${((killedAt - (end - 30_000)) / 1000).toFixed(0)} s in: ${statuses.length} requests at c=16 over 30 s, ${failed.length} failed; ` +
        `the restarted worker (pid ${victim.pid}) ran ${servedByRestarted} batches`,
    );
    expect(failed).toEqual([]);
    expect(victim.pid).not.toBe(pid);
    expect(victim.state).toBe('running');
    expect(servedByRestarted).toBeGreaterThan(0);
  }, 90_000);
});
