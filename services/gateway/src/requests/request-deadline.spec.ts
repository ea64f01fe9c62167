import { RpcError } from '@infermesh/grpc';
import { headerTimeoutMs, requestDeadline } from './request-deadline';

describe(requestDeadline.name, () => {
  const limits = { defaultMs: 30_000, maxMs: 600_000 };
  const now = 1_000_000;

  it('takes the earliest deadline the request names', () => {
    expect(
      requestDeadline({ grpcDeadlineMs: now + 5_000, headerTimeoutMs: 2_000, parameterTimeoutMs: 9_000 }, limits, now),
    ).toBe(now + 2_000);
    expect(requestDeadline({ parameterTimeoutMs: 9_000 }, limits, now)).toBe(now + 9_000);
  });

  it('gives a request that names none the default', () => {
    expect(requestDeadline({}, limits, now)).toBe(now + 30_000);
  });

  it('cuts every deadline to the maximum, however far it was', () => {
    expect(requestDeadline({ parameterTimeoutMs: 4e14 }, limits, now)).toBe(now + 600_000);
    expect(requestDeadline({ headerTimeoutMs: 2_147_483_647 }, limits, now)).toBe(now + 600_000);
    expect(requestDeadline({ grpcDeadlineMs: now + 50 * 86_400_000 }, limits, now)).toBe(now + 600_000);
  });
});

describe(headerTimeoutMs.name, () => {
  it('reads a positive whole number of milliseconds, however large', () => {
    expect(headerTimeoutMs(undefined)).toBeUndefined();
    expect(headerTimeoutMs(' 250 ')).toBe(250);
    expect(headerTimeoutMs('99999999999999999999')).toBe(1e20);
  });

  it.each(['0', '-1', '1.5', 'soon', '', '1e9'])('refuses %j naming the header', (value) => {
    expect(() => headerTimeoutMs(value)).toThrow(RpcError);
    expect(() => headerTimeoutMs(value)).toThrow(/x-request-timeout-ms must be a positive integer/);
  });
});
