import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type ServiceName, ServiceProcess, serviceEntry } from './service-process';

/**
 * A stand-in service: MODE=serve drains for 50 ms on SIGTERM, MODE=stubborn ignores SIGTERM,
 * MODE=crash exits with code 3 soon after starting. It says "ready" once its handlers are in place.
 */
const SCRIPT = `
const mode = process.env.MODE;
process.on('SIGTERM', () => {
  if (mode === 'stubborn') { console.log('ignoring SIGTERM'); return; }
  console.log('draining');
  setTimeout(() => process.exit(0), 50);
});
console.log('started with GREETING=' + process.env.GREETING + ' PATH=' + process.env.PATH);
console.error('a line on stderr');
console.log('ready');
if (mode === 'crash') setTimeout(() => process.exit(3), 50);
else setInterval(() => undefined, 1000);
`;

interface Exit {
  name: ServiceName;
  code: number | null;
  signal: NodeJS.Signals | null;
}

async function eventually(condition: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe(ServiceProcess.name, () => {
  let dir: string;
  let entry: string;
  const started: ServiceProcess[] = [];
  let lines: [ServiceName, string][];
  let exits: Exit[];

  function create(mode: 'serve' | 'stubborn' | 'crash'): ServiceProcess {
    const sut = new ServiceProcess(
      'worker',
      entry,
      { MODE: mode, GREETING: 'hello' },
      (name, line) => lines.push([name, line]),
      (name, code, signal) => exits.push({ name, code, signal }),
    );
    started.push(sut);
    return sut;
  }

  const said = (text: string) => lines.some(([, line]) => line === text);

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'service-process-'));
    entry = join(dir, 'main.js');
    writeFileSync(entry, SCRIPT);
  });

  beforeEach(() => {
    lines = [];
    exits = [];
  });

  afterEach(async () => {
    for (const sut of started.splice(0)) await sut.kill();
  });

  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('runs the entry with exactly the given environment and passes each line of stdout and stderr to the sink with its name', async () => {
    const sut = create('serve');

    sut.start();
    await eventually(() => said('ready') && said('a line on stderr')); // two pipes: no order between them

    expect(process.env['PATH']).toBeDefined(); // the parent's variables are not passed on
    expect(sut.running).toBe(true);
    expect(sut.pid).toEqual(expect.any(Number));
    expect(lines).toEqual(
      expect.arrayContaining([
        ['worker', 'started with GREETING=hello PATH=undefined'],
        ['worker', 'a line on stderr'],
        ['worker', 'ready'],
      ]),
    );
  });

  it('does not start a second process while one runs', async () => {
    const sut = create('serve');
    sut.start();
    const pid = sut.pid;

    sut.start();

    expect(sut.pid).toBe(pid);
    await eventually(() => said('ready'));
    expect(lines.filter(([, line]) => line === 'ready')).toHaveLength(1);
  });

  it('stop() sends SIGTERM and resolves once the process has exited, without reporting an unexpected exit', async () => {
    const sut = create('serve');
    sut.start();
    await eventually(() => said('ready'));
    const pid = sut.pid!;

    await sut.stop();

    expect(sut.running).toBe(false);
    expect(isAlive(pid)).toBe(false);
    await eventually(() => said('draining'));
    expect(exits).toEqual([]);
  });

  it('stop() kills a process that ignores SIGTERM once the grace period ends', async () => {
    const sut = create('stubborn');
    sut.start();
    await eventually(() => said('ready'));
    const begun = Date.now();

    await sut.stop(300);

    expect(Date.now() - begun).toBeGreaterThanOrEqual(250);
    expect(Date.now() - begun).toBeLessThan(3_000);
    expect(sut.running).toBe(false);
    expect(said('ignoring SIGTERM')).toBe(true);
    expect(exits).toEqual([]);
  });

  it('kill() ends the process at once, without clean-up and without reporting an unexpected exit', async () => {
    const sut = create('stubborn');
    sut.start();
    await eventually(() => said('ready'));
    const pid = sut.pid!;

    await sut.kill();

    expect(sut.running).toBe(false);
    expect(isAlive(pid)).toBe(false);
    expect(said('ignoring SIGTERM')).toBe(false);
    expect(exits).toEqual([]);
  });

  it('reports an exit nobody asked for with the exit code', async () => {
    const sut = create('crash');

    sut.start();
    await eventually(() => exits.length > 0);

    expect(exits).toEqual([{ name: 'worker', code: 3, signal: null }]);
    expect(sut.running).toBe(false);
  });

  it('reports a process killed from outside with the signal', async () => {
    const sut = create('serve');
    sut.start();
    await eventually(() => said('ready'));

    process.kill(sut.pid!, 'SIGKILL');
    await eventually(() => exits.length > 0);

    expect(exits).toEqual([{ name: 'worker', code: null, signal: 'SIGKILL' }]);
  });

  it('starts again after a kill, and reports the new process exiting unexpectedly', async () => {
    const sut = create('serve');
    sut.start();
    await eventually(() => said('ready'));
    const firstPid = sut.pid;
    await sut.kill();

    lines = [];
    sut.start();
    await eventually(() => said('ready'));

    expect(sut.running).toBe(true);
    expect(sut.pid).not.toBe(firstPid);
    process.kill(sut.pid!, 'SIGKILL');
    await eventually(() => exits.length > 0);
    expect(exits).toEqual([{ name: 'worker', code: null, signal: 'SIGKILL' }]);
  });

  it('stop() and kill() do nothing when the process never started or already exited', async () => {
    const sut = create('crash');

    await expect(sut.stop()).resolves.toBeUndefined();
    await expect(sut.kill()).resolves.toBeUndefined();
    sut.start();
    await eventually(() => !sut.running);
    await expect(sut.stop()).resolves.toBeUndefined();
    expect(exits).toHaveLength(1);
  });
});

describe('serviceEntry', () => {
  it('points at the compiled main.js of the service under dist/', () => {
    expect(serviceEntry('/repo/dist', 'gateway')).toBe(join('/repo/dist', 'services', 'gateway', 'src', 'main.js'));
  });
});
