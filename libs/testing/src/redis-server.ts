import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually } from './eventually';
import { freePort } from './free-port';

export interface RedisServer {
  url: string;
  port: number;
  stop(): Promise<void>;
}

/**
 * Starts a real redis-server on a free loopback port with no persistence. A missing binary is an
 * error that says how to install it: tests never skip silently.
 */
export async function startRedisServer(): Promise<RedisServer> {
  const probe = spawnSync('redis-server', ['--version'], { encoding: 'utf8' });
  if (probe.error !== undefined || probe.status !== 0) {
    throw new Error(
      'redis-server is required by the tests but was not found on PATH. Install it with ' +
        '`apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS).',
    );
  }
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'infermesh-redis-'));
  const child: ChildProcess = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: 'ignore' },
  );
  await eventually(
    async () => {
      if (child.exitCode !== null) throw new Error(`redis-server exited with code ${child.exitCode}`);
      return canConnect(port);
    },
    10_000,
    50,
  ).catch((error: unknown) => {
    throw child.exitCode === null ? new Error(`redis-server did not listen on ${port} within 10 s`) : error;
  });
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGTERM');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ port, host: '127.0.0.1' });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}
