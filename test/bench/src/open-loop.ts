import { type ServiceError, status } from '@grpc/grpc-js';
import { performance } from 'node:perf_hooks';

/** What an open loop saw: each answer's latency by outcome, in ms. */
export interface OpenLoopResult {
  sent: number;
  admitted: number[];
  /** The latencies of the requests sent after the loop's first second. */
  admittedAfterFirstSecond: number[];
  /** RESOURCE_EXHAUSTED: the gateway refused them. */
  refused: number[];
  /** Of those, the streams its HTTP/2 server refused (reset ENHANCE_YOUR_CALM) before the gateway saw them. */
  refusedStreams: number;
  otherErrors: number;
  /** Sent and not answered within `graceMs` after the loop ended. */
  unanswered: number;
}

/**
 * Sends `rate` requests a second for `durationMs`, whatever the answers (checked every 2 ms, so that
 * what is due goes out in small bursts), then waits up to `graceMs` for the last answers.
 */
export async function openLoop(
  send: () => Promise<unknown>,
  rate: number,
  durationMs: number,
  graceMs: number,
): Promise<OpenLoopResult> {
  const admitted: number[] = [];
  const admittedAfterFirstSecond: number[] = [];
  const refused: number[] = [];
  let refusedStreams = 0;
  let otherErrors = 0;
  let sent = 0;
  let answered = 0;
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const tick = setInterval(() => {
      const now = performance.now();
      const due = Math.min(Math.floor(((now - start) / 1000) * rate), Math.floor((durationMs / 1000) * rate));
      for (; sent < due; sent++) {
        const t = performance.now();
        send().then(
          () => {
            answered += 1;
            admitted.push(performance.now() - t);
            if (t - start >= 1_000) admittedAfterFirstSecond.push(performance.now() - t);
          },
          (error: unknown) => {
            answered += 1;
            if ((error as ServiceError).code === status.RESOURCE_EXHAUSTED) {
              refused.push(performance.now() - t);
              if ((error as { rstCode?: number }).rstCode !== undefined) refusedStreams += 1;
            } else otherErrors += 1;
          },
        );
      }
      if (now - start >= durationMs) {
        clearInterval(tick);
        resolve();
      }
    }, 2);
  });
  const graceEnd = performance.now() + graceMs;
  while (answered < sent && performance.now() < graceEnd) await new Promise((r) => setTimeout(r, 50));
  return {
    sent,
    admitted,
    admittedAfterFirstSecond,
    refused,
    refusedStreams,
    otherErrors,
    unanswered: sent - answered,
  };
}
