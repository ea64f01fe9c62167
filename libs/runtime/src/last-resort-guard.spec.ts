import { lastResortGuard } from './bootstrap';

describe(lastResortGuard.name, () => {
  const run = (started: boolean) => {
    const lines: string[] = [];
    const exits: number[] = [];
    const sut = lastResortGuard('uncaught exception', {
      service: 'gateway',
      started: () => started,
      write: (line) => lines.push(line),
      exit: (code) => exits.push(code),
    });
    sut(new TypeError('Deadline is too far in the future'));
    return { lines, exits };
  };

  it('logs what nothing caught once the service has started, and the service goes on', () => {
    const { lines, exits } = run(true);
    expect(exits).toEqual([]);
    expect(JSON.parse(lines[0]!)).toMatchObject({
      level: 'error',
      service: 'gateway',
      msg: 'uncaught exception; the service goes on',
      err: expect.stringContaining('Deadline is too far in the future'),
    });
  });

  it('stops a service that has not started yet, saying why', () => {
    const { lines, exits } = run(false);
    expect(exits).toEqual([1]);
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 'fatal', msg: 'uncaught exception: the service stops' });
  });
});
