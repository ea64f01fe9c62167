import { Injectable } from '@nestjs/common';

/** The wall clock, injected so that time can be controlled in tests. */
@Injectable()
export class Clock {
  now(): Date {
    return new Date();
  }
}
