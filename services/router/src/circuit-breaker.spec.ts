import { ManualClock } from '@infermesh/testing';
import { CircuitBreaker, type CircuitState } from './circuit-breaker';

describe(CircuitBreaker.name, () => {
  let clock: ManualClock;
  let transitions: CircuitState[];
  let sut: CircuitBreaker;

  beforeEach(() => {
    clock = new ManualClock(1_000);
    transitions = [];
    sut = new CircuitBreaker({ failureThreshold: 3, cooldownMs: 500, clock, onTransition: (s) => transitions.push(s) });
  });

  const fail = (times: number) => {
    for (let i = 0; i < times; i++) {
      expect(sut.tryAcquire()).toBe(true);
      sut.failed();
    }
  };

  it('opens after the threshold of consecutive failures and refuses calls for the cool-down', () => {
    fail(2);
    expect(sut.state).toBe('closed');
    fail(1);
    expect(sut.state).toBe('open');
    expect(sut.tryAcquire()).toBe(false);
    clock.advance(499);
    expect(sut.tryAcquire()).toBe(false);
    expect(sut.retryInMs).toBe(1);
    expect(transitions).toEqual(['open']);
  });

  it('does not count failures separated by a success', () => {
    fail(2);
    sut.tryAcquire();
    sut.succeeded();
    fail(2);
    expect(sut.state).toBe('closed');
  });

  it('after the cool-down lets one probe through at a time; a success closes it', () => {
    fail(3);
    clock.advance(500);
    expect(sut.state).toBe('half_open');
    expect(sut.tryAcquire()).toBe(true);
    expect(sut.tryAcquire()).toBe(false);
    sut.succeeded();
    expect(sut.state).toBe('closed');
    expect(sut.tryAcquire()).toBe(true);
    expect(transitions).toEqual(['open', 'half_open', 'closed']);
  });

  it('opens again at once when the probe fails', () => {
    fail(3);
    clock.advance(500);
    expect(sut.tryAcquire()).toBe(true);
    sut.failed();
    expect(sut.state).toBe('open');
    expect(sut.retryInMs).toBe(500);
  });

  it('lets another probe through when one was abandoned', () => {
    fail(3);
    clock.advance(500);
    expect(sut.tryAcquire()).toBe(true);
    sut.abandoned();
    expect(sut.state).toBe('half_open');
    expect(sut.tryAcquire()).toBe(true);
  });
});
