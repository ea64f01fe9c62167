/**
 * A client of its own during the batching benchmark's overload: a process that sends a small share of
 * the overload's requests, and a ServerLive every 10 ms, and measures their answers. The process that
 * sends the rest is itself saturated (its event loop runs late), and every latency it measures
 * includes that; this one's loop is idle between its few calls.
 *
 * Run by `fork` with: the gateway's gRPC address, the model and its input's features (the requests
 * are the benchmark's own), requests per second, how long (ms), and how long to wait for the last
 * answers (ms). Sends its figures to the parent (process.send), then exits.
 */
import { openLoop } from './open-loop';
import { LoadClient, seededRequests, serverLive, serverLiveEvery, unary } from './raw-infer';
import { loopDelay, quantile, round } from './stats';

/** The figures a probe sends back. */
export interface ProbeFigures {
  sent: number;
  admitted: number;
  refused: number;
  refused_streams: number;
  other_errors: number;
  unanswered: number;
  admitted_p99_ms: number;
  reject_p50_ms: number;
  reject_p99_ms: number;
  serverlive_p50_ms: number;
  serverlive_p99_ms: number;
  /** Its own event loop's delay p99 (loopDelay). */
  loop_delay_p99_ms: number;
}

async function main(): Promise<void> {
  const [address, model, features, rate, durationMs, graceMs] = process.argv.slice(2);
  if (
    address === undefined ||
    model === undefined ||
    [features, rate, durationMs, graceMs].some((v) => !(Number(v) > 0))
  )
    throw new Error('usage: overload-probe <gateway address> <model> <features> <requests/s> <duration ms> <grace ms>');
  const client = new LoadClient(address);
  const live = new LoadClient(address);
  // Seeds far from the load generator's, so that no two requests are the same.
  const requests = seededRequests(model, [Number(features)]);
  let seed = 1_000_000_000;
  // Connected (a first ServerLive on each connection) before it says it is ready; it starts on 'go'.
  await Promise.all([client, live].map((c) => serverLive(c)));
  const go = new Promise((resolve) => process.once('message', resolve));
  process.send!('ready');
  await go;
  const liveProbe = serverLiveEvery(live, 10);
  const loop = loopDelay();
  const result = await openLoop(
    () => unary(client, requests(seed++), 30_000),
    Number(rate),
    Number(durationMs),
    Number(graceMs),
  );
  const loopMs = loop.stop();
  const liveMs = liveProbe.stop();
  client.close();
  live.close();
  const figures: ProbeFigures = {
    sent: result.sent,
    admitted: result.admitted.length,
    refused: result.refused.length,
    refused_streams: result.refusedStreams,
    other_errors: result.otherErrors,
    unanswered: result.unanswered,
    admitted_p99_ms: round(quantile(result.admitted, 0.99), 2),
    reject_p50_ms: round(quantile(result.refused, 0.5), 2),
    reject_p99_ms: round(quantile(result.refused, 0.99), 2),
    serverlive_p50_ms: round(quantile(liveMs, 0.5), 2),
    serverlive_p99_ms: round(quantile(liveMs, 0.99), 2),
    loop_delay_p99_ms: loopMs.p99,
  };
  // Sent before the process exits.
  await new Promise((resolve) => process.send!(figures, resolve));
}

if (require.main === module) {
  main().then(
    () => process.exit(0),
    (error: unknown) => {
      process.stderr.write(`overload probe: ${error instanceof Error ? error.message : String(error)}\n`);
      process.exit(1);
    },
  );
}
