import { type Clock, systemClock } from '@infermesh/clock';
export type CircuitState = 'closed' | 'open' | 'half_open';

export interface CircuitBreakerOptions {
  /** Consecutive failures that open the circuit. */
  failureThreshold: number;
  /** How long an open circuit refuses calls before it lets one probe through. */
  cooldownMs: number;
  /** Told of every change of state. */
  onTransition?: (to: CircuitState) => void;
  /** Time (systemClock unless given). */
  clock?: Clock;
}

/**
 * A circuit breaker: closed, it lets every call through and counts consecutive failures; at the
 * threshold it opens and refuses calls for the cool-down; then it is half-open and lets one call
 * through at a time as a probe: a success closes it, a failure opens it again.
 */
export class CircuitBreaker {
  private current: CircuitState = 'closed';
  private failures = 0;
  private openedAt = 0;
  private probing = false;
  private readonly clock: Clock;

  constructor(private readonly options: CircuitBreakerOptions) {
    this.clock = options.clock ?? systemClock;
  }

  get state(): CircuitState {
    if (this.current === 'open' && this.clock.now() - this.openedAt >= this.options.cooldownMs)
      this.moveTo('half_open');
    return this.current;
  }

  /** Milliseconds until an open circuit lets a probe through; 0 otherwise. */
  get retryInMs(): number {
    return this.state === 'open' ? Math.max(0, this.openedAt + this.options.cooldownMs - this.clock.now()) : 0;
  }

  /** Whether a call may go now; a half-open circuit lets one through until its outcome is known. */
  tryAcquire(): boolean {
    switch (this.state) {
      case 'closed':
        return true;
      case 'open':
        return false;
      case 'half_open':
        if (this.probing) return false;
        this.probing = true;
        return true;
    }
  }

  /** The upstream answered. */
  succeeded(): void {
    this.probing = false;
    this.failures = 0;
    if (this.current !== 'closed') this.moveTo('closed');
  }

  /** The upstream failed or timed out. */
  failed(): void {
    this.probing = false;
    this.failures += 1;
    if (this.current === 'half_open' || (this.current === 'closed' && this.failures >= this.options.failureThreshold)) {
      this.openedAt = this.clock.now();
      this.moveTo('open');
    }
  }

  /**
   * The call ended without telling anything about the upstream's health: the client cancelled it,
   * its deadline was the caller's to miss, or the request was refused as invalid. Neither a failure
   * nor a success: the count of consecutive failures stays, and a half-open circuit lets the next
   * probe through.
   */
  abandoned(): void {
    this.probing = false;
  }

  private moveTo(state: CircuitState): void {
    this.current = state;
    this.options.onTransition?.(state);
  }
}
