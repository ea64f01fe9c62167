import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { freePortList } from '@infermesh/testing';
import { DIST } from './support/system-fixture';

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
