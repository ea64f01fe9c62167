import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { eventually, ManualClock } from '@infermesh/testing';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type RestartPolicy,
  type ServiceName,
  ServiceProcess,
  type SupervisionEvent,
  describeSupervisionEvent,
  serviceEntry,
} from './service-process';

/**
 * A stand-in service: MODE=serve drains for 50 ms on SIGTERM, MODE=stubborn ignores SIGTERM,
 * MODE=crash exits with code 3 soon after starting. It says "ready" once its handlers are in place.
 * Its timers are its own (the child's): the supervisor's time is the spec's ManualClock.
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
  let events: SupervisionEvent[];
  let clock: ManualClock;

  function create(mode: 'serve' | 'stubborn' | 'crash', restart?: RestartPolicy): ServiceProcess {
    const sut = new ServiceProcess(
      'worker',
      entry,
      { MODE: mode, GREETING: 'hello' },
      (name, line) => lines.push([name, line]),
      (name, code, signal) => exits.push({ name, code, signal }),
      { restart, onSupervision: (_name, event) => events.push(event), clock },
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
    events = [];
    clock = new ManualClock();
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
    let stopped = false;

    const stop = sut.stop(300).then(() => (stopped = true));
    await eventually(() => said('ignoring SIGTERM'));
    clock.advance(299);
    expect(sut.running).toBe(true);
    expect(stopped).toBe(false);
    clock.advance(1);
    await stop;

    expect(sut.running).toBe(false);
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

  describe('with a restart policy', () => {
    const policy: RestartPolicy = { initialBackoffMs: 40, maxBackoffMs: 100, stableAfterMs: 60_000, crashLoopLimit: 4 };

    it('starts a process killed from outside again after the back-off, saying why it ended', async () => {
      const sut = create('serve', policy);
      sut.start();
      await eventually(() => said('ready'));
      const firstPid = sut.pid!;

      process.kill(firstPid, 'SIGKILL');
      await eventually(() => sut.state === 'backoff');
      expect(clock.pendingInMs()).toEqual([40]);
      clock.advance(39);
      expect(sut.state).toBe('backoff');
      clock.advance(1);
      expect(events.map((e) => e.kind)).toEqual(['restarting', 'restarted']);
      await eventually(() => lines.filter(([, line]) => line === 'ready').length === 2);

      expect(sut.running).toBe(true);
      expect(sut.pid).not.toBe(firstPid);
      expect(sut.restartCount).toBe(1);
      expect(exits).toEqual([{ name: 'worker', code: null, signal: 'SIGKILL' }]);
      expect(events[0]).toEqual({
        kind: 'restarting',
        delayMs: 40,
        quickExits: 1,
        exit: {
          code: null,
          signal: 'SIGKILL',
          ranMs: 0, // the spec's clock did not move while it ran
          lastLine: expect.stringMatching(/^(ready|a line on stderr)$/),
        },
      });
      expect(events[1]).toEqual({ kind: 'restarted', pid: sut.pid, restarts: 1 });
    });

    it('doubles the back-off with each quick exit in a row, up to its maximum, and gives up on a crash loop', async () => {
      const sut = create('crash', policy);

      sut.start();
      for (const backoffMs of [40, 80, 100]) {
        await eventually(() => sut.state === 'backoff');
        expect(clock.pendingInMs()).toEqual([backoffMs]);
        clock.advance(backoffMs);
      }
      await eventually(() => sut.state === 'crash-loop');
      expect(clock.pendingInMs()).toEqual([]); // no restart comes after giving up

      expect(events.map((e) => (e.kind === 'restarting' ? `restarting in ${e.delayMs}` : e.kind))).toEqual([
        'restarting in 40',
        'restarted',
        'restarting in 80',
        'restarted',
        'restarting in 100',
        'restarted',
        'crash-loop',
      ]);
      expect(exits).toHaveLength(4);
      expect(sut.running).toBe(false);
      const last = events.at(-1)!;
      expect(last).toMatchObject({ kind: 'crash-loop', quickExits: 4, exit: { code: 3, signal: null } });
      expect(describeSupervisionEvent('worker', last)).toMatch(
        /^worker is crash-looping: 4 exits in a row, each soon after starting \(exit code 3 after \d+\.\d s; its last line: (ready|a line on stderr)\); not restarting it again$/,
      );
    });

    it('counts an exit after a healthy run as the first of a new series: the back-off starts over', async () => {
      const sut = create('serve', { ...policy, stableAfterMs: 300 });
      sut.start();
      for (let round = 1; round <= 3; round += 1) {
        await eventually(() => lines.filter(([, line]) => line === 'ready').length === round);
        clock.advance(350); // a healthy run
        process.kill(sut.pid!, 'SIGKILL');
        await eventually(() => sut.state === 'backoff');
        clock.advance(40);
        expect(events.filter((e) => e.kind === 'restarted')).toHaveLength(round);
      }

      const firstOfASeries = expect.objectContaining({ delayMs: 40, quickExits: 1 }) as unknown;
      expect(events.filter((e) => e.kind === 'restarting')).toEqual([firstOfASeries, firstOfASeries, firstOfASeries]);
      expect(sut.state).toBe('running');
    });

    it('never restarts a process after stop() or kill(), even one stopped while it waited for its back-off', async () => {
      const sut = create('serve', { ...policy, initialBackoffMs: 300 });
      sut.start();
      await eventually(() => said('ready'));
      await sut.kill();
      expect(sut.state).toBe('stopped');
      expect(clock.pendingInMs()).toEqual([]);

      sut.start();
      await eventually(() => lines.filter(([, line]) => line === 'ready').length === 2);
      process.kill(sut.pid!, 'SIGKILL');
      await eventually(() => sut.state === 'backoff');
      await sut.stop();
      expect(clock.pendingInMs()).toEqual([]);
      clock.advance(1_000);

      expect(sut.state).toBe('stopped');
      expect(events.map((e) => e.kind)).toEqual(['restarting']);
    });
  });
});

describe('serviceEntry', () => {
  it('points at the compiled main.js of the service under dist/', () => {
    expect(serviceEntry('/repo/dist', 'gateway')).toBe(join('/repo/dist', 'services', 'gateway', 'src', 'main.js'));
  });
});
