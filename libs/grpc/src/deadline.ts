import type { IncomingHttpHeaders } from 'node:http2';

/**
 * The longest deadline a call carries: 24 days. Node's timers hold at most 2^31 - 1 ms (24.8 days);
 * a longer delay fires at once, and grpc-js reads a received `grpc-timeout` into a 32-bit integer,
 * so that a deadline 25 to 50 days away would expire as soon as it arrived. Every deadline a client
 * of this library sends, and every one a server of it receives, is bounded by this.
 */
export const MAX_DEADLINE_MS = 24 * 24 * 3600 * 1000;

/** The deadline, at most MAX_DEADLINE_MS from `now`. */
export function boundedDeadline(deadlineMs: number, now = Date.now()): number {
  return Math.min(deadlineMs, now + MAX_DEADLINE_MS);
}

/** A timer's delay until `deadlineMs`: never negative, never more than a timer can hold. */
export function delayUntil(deadlineMs: number, now = Date.now()): number {
  return Math.max(0, Math.min(deadlineMs - now, MAX_DEADLINE_MS));
}

const GRPC_TIMEOUT = 'grpc-timeout';
/** grpc-js's own reading of the header: up to 8 digits and a unit. */
const TIMEOUT_SYNTAX = /(\d{1,8})\s*([HMSmun])/;
const UNIT_MS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1_000, m: 1, u: 1e-3, n: 1e-6 };
/** MAX_DEADLINE_MS as a grpc-timeout value. */
const MAX_TIMEOUT_HEADER = `${MAX_DEADLINE_MS / 3_600_000}H`;

/**
 * Bounds the `grpc-timeout` of a received call's headers to MAX_DEADLINE_MS, in place, before
 * grpc-js reads them: a longer one would overflow its timer and expire the call at once.
 */
export function boundTimeoutHeader(headers: IncomingHttpHeaders): void {
  const value = headers[GRPC_TIMEOUT];
  if (typeof value !== 'string') return;
  const match = TIMEOUT_SYNTAX.exec(value);
  if (match === null) return; // grpc-js refuses it
  if (Number(match[1]) * UNIT_MS[match[2]!]! > MAX_DEADLINE_MS) headers[GRPC_TIMEOUT] = MAX_TIMEOUT_HEADER;
}
