import { createClient } from '@infermesh/grpc';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { fork } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { addPhase, closedLoop, emptyPhase } from './closed-loop';
import { quantile, round, table } from './stats';

const CONCURRENCY = [1, 16];
const PHASE_MS = 2_000;
/** Phases of each way per point, alternating. */
const ROUNDS = 3;

/**
 * What a cache lookup costs as a unary call and as a call carried on a stream (CacheService/Lookups,
 * libs/grpc/src/carried-calls.ts), through the same libraries the router and the cache use: a client
 * in this process, a GrpcServer in a process of its own (lookup.server.ts) whose lookups find nothing
 * at once. Closed loop at concurrency 1 and 16, the two ways in alternating phases; CPU of both
 * processes per lookup from /proc, and the ratio carried ÷ unary.
 */
export async function carried(): Promise<Record<string, unknown>> {
  const server = fork(join(__dirname, 'lookup.server.js'), [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const [{ port }] = (await once(server, 'message')) as [{ port: number }];
  const address = `127.0.0.1:${port}`;
  const clients = {
    unary: createClient(CacheService, address),
    carried: createClient(CacheService, address, { carried: { lookup: 'lookups' } }),
  };
  const processes = [
    { name: 'client', pid: process.pid },
    { name: 'server', pid: server.pid! },
  ];
  const figures: Record<string, number> = {};
  const rows: (string | number)[][] = [];
  try {
    for (const concurrency of CONCURRENCY) {
      const totals = { unary: emptyPhase(), carried: emptyPhase() };
      for (const way of ['unary', 'carried'] as const) {
        await closedLoop([], 0, { concurrency, durationMs: 500 }, (seed) => lookup(clients[way], seed));
      }
      for (let round_ = 0; round_ < ROUNDS; round_++) {
        for (const way of ['unary', 'carried'] as const) {
          addPhase(
            totals[way],
            await closedLoop(processes, round_ * 1e7, { concurrency, durationMs: PHASE_MS }, (seed) =>
              lookup(clients[way], seed),
            ),
          );
        }
      }
      const point = (way: 'unary' | 'carried') => {
        const total = totals[way];
        if (total.failures > 0) throw new Error(`${way} lookups failed ${total.failures} times at c=${concurrency}`);
        return {
          rps: total.latenciesMs.length / ((ROUNDS * PHASE_MS) / 1000),
          p50: quantile(total.latenciesMs, 0.5),
          cpuUs: total.cpuUs / total.latenciesMs.length,
        };
      };
      const unary = point('unary');
      const viaStream = point('carried');
      const c = `c${concurrency}`;
      figures[`${c}_unary_cpu_us`] = round(unary.cpuUs, 1);
      figures[`${c}_carried_cpu_us`] = round(viaStream.cpuUs, 1);
      figures[`${c}_carried_over_unary_cpu`] = round(viaStream.cpuUs / unary.cpuUs);
      figures[`${c}_unary_p50_ms`] = round(unary.p50);
      figures[`${c}_carried_p50_ms`] = round(viaStream.p50);
      rows.push(
        [c, 'unary', round(unary.rps, 0), round(unary.p50), round(unary.cpuUs, 1)],
        [c, 'carried', round(viaStream.rps, 0), round(viaStream.p50), round(viaStream.cpuUs, 1)],
      );
    }
  } finally {
    clients.unary.close();
    clients.carried.close();
    server.disconnect();
  }
  process.stdout.write(`${table(['point', 'way', 'lookups/s', 'p50 ms', 'CPU µs/lookup'], rows)}\n`);
  return { scenario: 'carried', phase_ms: PHASE_MS, rounds: ROUNDS, ...figures };
}

/** A lookup of a 32-byte key, as the router sends one. */
function lookup(client: ReturnType<typeof createClient<typeof CacheService>>, seed: number) {
  const key = new Uint8Array(32);
  new DataView(key.buffer).setUint32(0, seed);
  return client.lookup({ key }, { timeoutMs: 5_000 });
}
