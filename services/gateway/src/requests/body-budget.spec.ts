import { status } from '@grpc/grpc-js';
import { ManualClock } from '@infermesh/clock/manual-clock.testing';
import { RpcError } from '@infermesh/grpc';
import { thrownBy } from '@infermesh/testing';
import { Metrics } from '@infermesh/telemetry';
import { BodyBudget } from './body-budget';

describe(BodyBudget.name, () => {
  let metrics: Metrics;
  let sut: BodyBudget;
  let clock: ManualClock;

  beforeEach(() => {
    metrics = new Metrics('gateway');
    clock = new ManualClock();
    sut = new BodyBudget({ maxBodyBytesInFlight: 100, http: { receiveTimeoutMs: 1_000 } }, metrics, clock);
  });

  afterEach(() => sut.onModuleDestroy());

  const refusal = (fn: () => unknown): RpcError => thrownBy(fn, RpcError);

  it('holds reservations up to the limit and refuses the one that would pass it, naming the limit', () => {
    const a = sut.reserve(60);
    const error = refusal(() => sut.reserve(41));

    expect(error.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(error.message).toContain('GATEWAY_MAX_BODY_BYTES_IN_FLIGHT');
    expect(error.retryDelayMs).toBeGreaterThan(0);
    expect(sut.bytesInFlight).toBe(60);
    sut.reserve(40);
    expect(sut.bytesInFlight).toBe(100);
    a.release();
    expect(sut.bytesInFlight).toBe(40);
  });

  it('grows a reservation as a body of unknown size arrives, and refuses the bytes that do not fit', () => {
    const body = sut.reserve(0);
    body.grow(70);
    sut.reserve(20);
    expect(() => body.grow(20)).toThrow(/GATEWAY_MAX_BODY_BYTES_IN_FLIGHT/);
    expect(sut.bytesInFlight).toBe(90);
    body.release();
    expect(sut.bytesInFlight).toBe(20);
  });

  it('gives bytes back once, however often a reservation is released', () => {
    const body = sut.reserve(50);
    body.release();
    body.release();
    body.grow(10);
    expect(sut.bytesInFlight).toBe(0);
  });

  it('reports the bytes in flight as a gauge', async () => {
    sut.reserve(30);
    expect(await metrics.render()).toMatch(/^infermesh_gateway_request_body_bytes_in_flight 30$/m);
  });

  it('refuses a body still arriving a receive timeout after its reading began (408, naming the setting), not one that came', () => {
    const overdue: RpcError[] = [];
    const slow = {};
    sut.watchArrival(slow, (error) => overdue.push(error as RpcError));
    const arrived = sut.watchArrival({}, () => overdue.push(refusal(() => undefined)));
    clock.advance(600);
    arrived();
    clock.advance(399);
    expect(overdue).toHaveLength(0);
    clock.advance(1); // the check at 1,000 (every quarter of the timeout)
    expect(overdue.map((e) => [e.code, e.httpStatus, e.message])).toEqual([
      [
        status.DEADLINE_EXCEEDED,
        408,
        'the request body did not arrive whole within 1000 ms (GATEWAY_HTTP_RECEIVE_TIMEOUT_MS)',
      ],
    ]);
  });
});
