import { INVALID_SPAN_CONTEXT, trace, TraceFlags } from '@opentelemetry/api';
import { JsonLogger, type LogLevel } from './json-logger';
import { requestContext } from './request-context';

function capture(level: LogLevel = 'debug') {
  const chunks: string[] = [];
  const sut = new JsonLogger('router', level, (line) => chunks.push(line));
  const entries = () =>
    chunks
      .join('')
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => JSON.parse(line) as Record<string, unknown>);
  return { sut, chunks, entries };
}

describe(JsonLogger.name, () => {
  it('writes one JSON object per line with time, level, service and msg', () => {
    const { sut, chunks, entries } = capture();

    sut.info('model loaded');
    sut.warn('slow upstream');

    expect(chunks).toHaveLength(2);
    for (const chunk of chunks) expect(chunk.endsWith('\n') && chunk.indexOf('\n') === chunk.length - 1).toBe(true);
    const [first, second] = entries();
    expect(first).toMatchObject({ level: 'info', service: 'router', msg: 'model loaded' });
    expect(second).toMatchObject({ level: 'warn', service: 'router', msg: 'slow upstream' });
    expect(new Date(first!['time'] as string).toISOString()).toBe(first!['time']);
  });

  it('keeps a message with line breaks on one line', () => {
    const { sut, chunks, entries } = capture();

    sut.error('first line\nsecond line');

    expect(chunks[0]!.split('\n')).toHaveLength(2);
    expect(entries()[0]?.['msg']).toBe('first line\nsecond line');
  });

  it('adds the current request id inside requestContext.run, and none outside', async () => {
    const { sut, entries } = capture();

    sut.info('before');
    await requestContext.run({ requestId: 'req-7' }, async () => {
      sut.info('sync');
      await new Promise((resolve) => setImmediate(resolve)); // a hop through the event loop
      sut.info('after an await');
    });
    sut.info('after');

    expect(entries().map((e) => e['request_id'])).toEqual([undefined, 'req-7', 'req-7', undefined]);
  });

  it('adds the trace and span ids of the current span, sampled or not, to every line of the request', async () => {
    const { sut, entries } = capture();
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const sampled = trace.wrapSpanContext({ traceId, spanId: '00f067aa0ba902b7', traceFlags: TraceFlags.SAMPLED });
    const unsampled = trace.wrapSpanContext({ traceId, spanId: '53995c3f42cd8ad8', traceFlags: TraceFlags.NONE });

    await requestContext.run({ requestId: 'r', span: sampled }, async () => {
      sut.info('sync');
      await new Promise((resolve) => setImmediate(resolve)); // a hop through the event loop
      sut.error('after an await', new Error('boom'));
    });
    requestContext.run({ requestId: 'r', span: unsampled }, () => sut.warn('unsampled'));

    expect(entries().map((e) => [e['msg'], e['request_id'], e['trace_id'], e['span_id']])).toEqual([
      ['sync', 'r', traceId, '00f067aa0ba902b7'],
      ['after an await', 'r', traceId, '00f067aa0ba902b7'],
      ['unsampled', 'r', traceId, '53995c3f42cd8ad8'],
    ]);
  });

  it('writes no trace ids outside a request, in a request without a span, or with an invalid span', () => {
    const { sut, entries } = capture();

    sut.info('outside');
    requestContext.run({ requestId: 'r' }, () => sut.info('no span'));
    requestContext.run({ requestId: 'r', span: trace.wrapSpanContext(INVALID_SPAN_CONTEXT) }, () =>
      sut.info('invalid span'),
    );

    expect(entries()).toHaveLength(3);
    for (const entry of entries()) {
      expect(entry).not.toHaveProperty('trace_id');
      expect(entry).not.toHaveProperty('span_id');
    }
  });

  it('keeps concurrent requests apart', async () => {
    const { sut, entries } = capture();

    // a starts first and logs last: b logs in between, then lets a go on.
    let releaseA!: () => void;
    const aMayLog = new Promise<void>((resolve) => (releaseA = resolve));
    await Promise.all([
      requestContext.run({ requestId: 'a' }, async () => {
        await aMayLog;
        sut.info('a');
      }),
      requestContext.run({ requestId: 'b' }, async () => {
        await new Promise((resolve) => setImmediate(resolve));
        sut.info('b');
        releaseA();
      }),
    ]);

    expect(entries().map((e) => [e['msg'], e['request_id']])).toEqual([
      ['b', 'b'],
      ['a', 'a'],
    ]);
  });

  it.each<[LogLevel, string[]]>([
    ['debug', ['debug', 'info', 'warn', 'error']],
    ['info', ['info', 'warn', 'error']],
    ['warn', ['warn', 'error']],
    ['error', ['error']],
  ])('at level %s writes only %p', (level, written) => {
    const { sut, entries } = capture(level);

    sut.debug('d');
    sut.verbose('v');
    sut.info('i');
    sut.log('l');
    sut.warn('w');
    sut.error('e');

    expect([...new Set(entries().map((e) => e['level']))]).toEqual(written);
  });

  it('writes Nest log and verbose calls as info and debug, with their context name', () => {
    const { sut, entries } = capture();

    sut.log('Mapped {/v2/models, GET}', 'RouterExplorer');
    sut.verbose('details', 'InstanceLoader');

    expect(entries()).toEqual([
      expect.objectContaining({ level: 'info', msg: 'Mapped {/v2/models, GET}', context: 'RouterExplorer' }),
      expect.objectContaining({ level: 'debug', msg: 'details', context: 'InstanceLoader' }),
    ]);
  });

  it('writes an error argument with its message and stack', () => {
    const { sut, entries } = capture();

    sut.error('upload failed', new Error('disk full'));

    const entry = entries()[0]!;
    expect(entry['msg']).toBe('upload failed');
    expect(entry['err']).toEqual({ message: 'disk full', stack: expect.stringContaining('disk full') });
  });

  it('writes an Error given as the message with its stack', () => {
    const { sut, entries } = capture();

    sut.error(new RangeError('bad shape'));

    expect(entries()[0]).toMatchObject({ msg: 'bad shape', stack: expect.stringContaining('RangeError: bad shape') });
  });

  it('merges fields into the entry, bigints as decimal strings', () => {
    const { sut, entries } = capture();

    sut.info('artifact stored', { sha256: 'ab12', sizeBytes: 2n ** 64n, chunks: 3 });

    expect(entries()[0]).toMatchObject({
      msg: 'artifact stored',
      sha256: 'ab12',
      sizeBytes: '18446744073709551616',
      chunks: 3,
    });
  });

  it("writes nested bigints as decimal strings too, leaving the caller's fields as they were", () => {
    const { sut, chunks } = capture();
    const fields = { model: { name: 'resnet', revisions: [1n, 2n] }, at: new Date(0) };

    sut.info('nested', fields);

    expect(JSON.parse(chunks[0]!)).toMatchObject({
      model: { name: 'resnet', revisions: ['1', '2'] },
      at: '1970-01-01T00:00:00.000Z',
    });
    expect(fields.model.revisions).toEqual([1n, 2n]);
  });

  it('writes a circular field instead of throwing', () => {
    const { sut, entries } = capture();
    const looped: Record<string, unknown> = { name: 'loop' };
    looped['self'] = looped;

    sut.info('circular', { looped });

    expect(entries()[0]).toMatchObject({ msg: 'circular', looped: { name: 'loop', self: '[Circular]' } });
  });

  it('writes a non-string message as JSON', () => {
    const { sut, entries } = capture();

    sut.warn({ queue: 3 });

    expect(entries()[0]?.['msg']).toBe('{"queue":3}');
  });

  it('writes to stdout by default', () => {
    const write = jest.spyOn(process.stdout, 'write').mockImplementation(() => true);
    try {
      new JsonLogger('cache').info('hello');

      expect(write).toHaveBeenCalledTimes(1);
      expect(JSON.parse(String(write.mock.calls[0]![0]))).toMatchObject({
        service: 'cache',
        msg: 'hello',
        level: 'info',
      });
    } finally {
      write.mockRestore();
    }
  });
});
