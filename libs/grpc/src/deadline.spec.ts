import { boundedDeadline, boundTimeoutHeader, delayUntil, MAX_DEADLINE_MS } from './deadline';

describe(boundTimeoutHeader.name, () => {
  it.each([
    ['720H', '576H'], // 30 days
    ['99999999H', '576H'],
    ['2147484S', '576H'], // just past what a timer holds
    ['99999999M', '576H'],
  ])('bounds a grpc-timeout of %s to 24 days (%s)', (given, bounded) => {
    const sut = { 'grpc-timeout': given };
    boundTimeoutHeader(sut);
    expect(sut['grpc-timeout']).toBe(bounded);
  });

  it.each(['30000m', '576H', '100S', '5n', 'nonsense'])('leaves %s as it is', (given) => {
    const sut = { 'grpc-timeout': given };
    boundTimeoutHeader(sut);
    expect(sut['grpc-timeout']).toBe(given);
  });

  it('leaves headers without a grpc-timeout alone', () => {
    const sut = { ':path': '/x' };
    boundTimeoutHeader(sut);
    expect(sut).toEqual({ ':path': '/x' });
  });

  it('keeps MAX_DEADLINE_MS within what a Node timer and grpc-js hold', () => {
    expect(MAX_DEADLINE_MS).toBeLessThan(2 ** 31 - 1);
    expect(MAX_DEADLINE_MS % 3_600_000).toBe(0);
  });
});

describe(boundedDeadline.name, () => {
  it('cuts a deadline beyond MAX_DEADLINE_MS and keeps a nearer one', () => {
    expect(boundedDeadline(1_000 + 10 * MAX_DEADLINE_MS, 1_000)).toBe(1_000 + MAX_DEADLINE_MS);
    expect(boundedDeadline(Infinity, 1_000)).toBe(1_000 + MAX_DEADLINE_MS);
    expect(boundedDeadline(5_000, 1_000)).toBe(5_000);
  });
});

describe(delayUntil.name, () => {
  it('is never negative nor more than a timer holds', () => {
    expect(delayUntil(500, 1_000)).toBe(0);
    expect(delayUntil(3_000, 1_000)).toBe(2_000);
    expect(delayUntil(1e18, 0)).toBe(MAX_DEADLINE_MS);
  });
});
