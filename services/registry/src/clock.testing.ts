import { Clock } from './clock';

/** For specs: time that moves only when the test says so. */
export class ManualClock extends Clock {
  private at = new Date('2030-01-01T00:00:00Z').getTime();

  override now(): Date {
    return new Date(this.at);
  }

  advance(ms: number): void {
    this.at += ms;
  }
}
