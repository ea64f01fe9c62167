import { createClient } from '@infermesh/grpc';
import { buildMlpModel } from '@infermesh/model-builder';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { DataType } from '@infermesh/tensors';
import { WORKER_MALLOC_ENV } from '@infermesh/system';
import * as ort from 'onnxruntime-node';
import { fork } from 'node:child_process';
import { once } from 'node:events';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFixture } from '../../e2e/support/system-fixture';
import { workerSession } from './in-process';
import { quantile, round, table } from './stats';

const BATCH_SIZES = [1, 8, 32, 64];
/** Requests kept in flight: 1 (one caller waiting on each answer) and 2 (a caller that pipelines, as the batcher does). */
const CONCURRENCY = [1, 2];
const WARMUP_ROUNDS = 5;
/** Rounds per batch size: enough for a few thousand items, at least 30. */
const rounds = (batch: number) => Math.max(30, Math.ceil(4096 / batch));
const HEALTH_INTERVAL_MS = 5;

/**
 * Items/s of the demo MLP at batch 1, 8, 32, 64 and concurrency 1 and 2: (a) in-process
 * onnxruntime-node with the worker's session settings, (b) WorkerService.Infer straight to the
 * worker, (c) the same call to a process that computes nothing (transport-floor.server.ts), all three
 * measured alternately, round by round. (c) is what the client, grpc-js, HTTP/2 and protobuf alone
 * cost for the MLP's bytes on this machine: in-process ÷ (in-process + floor) is the best ratio any
 * server could reach over this transport, and what the worker takes beyond compute and floor is its
 * own overhead. While (b) runs, a side client polls grpc.health.v1 Check every ~5 ms, of the worker
 * and of (c) in turn: what a process that computes nothing takes to answer it on this machine under
 * the same load is the reference for the worker's figure.
 */
export async function worker(): Promise<Record<string, unknown>> {
  const model = buildMlpModel();
  // The worker's default on this machine (one instance per model: all cores), set explicitly so that
  // both sides run the same session settings.
  const intraOpThreads = availableParallelism();
  const session = await workerSession(model.bytes, intraOpThreads);
  const fixture = await startFixture({
    models: ['mlp'],
    env: { WORKER_INSTANCES_PER_MODEL: '1', WORKER_INTRA_OP_THREADS: String(intraOpThreads) },
  });
  const address = fixture.system.grpcAddress('worker');
  const client = createClient(WorkerService, address);
  const health = createClient(Health, address);
  const floorServer = fork(join(__dirname, 'transport-floor.server.js'), [], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...WORKER_MALLOC_ENV, ...process.env },
  });
  const [{ port: floorPort }] = (await once(floorServer, 'message')) as [{ port: number }];
  const floorClient = createClient(WorkerService, `127.0.0.1:${floorPort}`);
  const floorHealth = createClient(Health, `127.0.0.1:${floorPort}`);

  const inputFor = (batch: number, i: number) => {
    const data = new Float32Array(batch * 512);
    for (let j = 0; j < data.length; j++) data[j] = Math.sin(i * 7919 + j);
    return data;
  };
  const viaGrpc = (to: typeof client) => async (batch: number, data: Float32Array) => {
    const response = await to.infer(
      {
        request: {
          modelName: 'mlp',
          modelVersion: '1',
          inputs: [
            { name: 'input', datatype: DataType.FP32, shape: [BigInt(batch), 512n], data: new Uint8Array(data.buffer) },
          ],
        },
      },
      { timeoutMs: 30_000 },
    );
    if (response.response?.outputs.length !== 1) throw new Error('the server answered without the output');
  };
  const paths = {
    inprocess: async (batch: number, data: Float32Array) => {
      await session.run({ input: new ort.Tensor('float32', data, [batch, 512]) });
    },
    worker: viaGrpc(client),
    floor: viaGrpc(floorClient),
  };

  /** One health check's latency in ms. */
  const check = async (of: typeof health) => {
    const start = process.hrtime.bigint();
    await of.check({ service: '' }, { timeoutMs: 5_000 });
    return Number(process.hrtime.bigint() - start) / 1e6;
  };
  // Health-check latency with the worker idle, as the reference for the figure under load.
  const idleHealthMs: number[] = [];
  const idleFloorHealthMs: number[] = [];
  for (let i = 0; i < 200; i++) {
    idleHealthMs.push(await check(health));
    await sleep(HEALTH_INTERVAL_MS);
    idleFloorHealthMs.push(await check(floorHealth));
    await sleep(HEALTH_INTERVAL_MS);
  }

  let polling = true;
  let measuring = false;
  const healthMs: number[] = [];
  const floorHealthMs: number[] = [];
  const poller = (async () => {
    while (polling) {
      for (const [of, into] of [
        [health, healthMs],
        [floorHealth, floorHealthMs],
      ] as const) {
        const counted = measuring;
        const ms = await check(of);
        if (counted && measuring) into.push(ms);
        await sleep(HEALTH_INTERVAL_MS);
      }
    }
  })();

  type Row = {
    inprocess: number;
    worker: number;
    ratio: number;
    transport_floor: number;
    ratio_ceiling: number;
    worker_added_ms: number;
  };
  const throughput: Record<string, Row> = {};
  try {
    for (const concurrency of CONCURRENCY) {
      for (const batch of BATCH_SIZES) {
        const elapsed = { inprocess: 0, worker: 0, floor: 0 };
        const n = rounds(batch);
        for (let i = 0; i < WARMUP_ROUNDS + n; i++) {
          for (const name of ['inprocess', 'worker', 'floor'] as const) {
            const inputs = Array.from({ length: concurrency }, (_, c) => inputFor(batch, i * concurrency + c));
            measuring = name === 'worker' && i >= WARMUP_ROUNDS;
            const start = process.hrtime.bigint();
            await Promise.all(inputs.map((data) => paths[name](batch, data)));
            if (i >= WARMUP_ROUNDS) elapsed[name] += Number(process.hrtime.bigint() - start) / 1e9;
            measuring = false;
          }
        }
        const items = batch * n * concurrency;
        const inprocess = items / elapsed.inprocess;
        const viaWorker = items / elapsed.worker;
        throughput[`c${concurrency}_b${batch}`] = {
          inprocess: round(inprocess, 1),
          worker: round(viaWorker, 1),
          ratio: round(viaWorker / inprocess),
          transport_floor: round(items / elapsed.floor, 1),
          // Compute and transport one after the other, as a caller that waits for each answer sees them.
          ratio_ceiling: round(elapsed.inprocess / (elapsed.inprocess + elapsed.floor)),
          // Per round: what the worker took beyond computing and the transport floor.
          worker_added_ms: round(((elapsed.worker - elapsed.inprocess - elapsed.floor) / n) * 1000),
        };
      }
    }
  } finally {
    polling = false;
    await poller.catch(() => undefined);
    client.close();
    floorClient.close();
    floorHealth.close();
    floorServer.disconnect();
    health.close();
    await session.release();
    await fixture.stop();
  }

  const result = {
    scenario: 'worker',
    model: 'mlp (FP32 512-2048-2048-512, ~25 MB)',
    worker_instances_per_model: 1,
    intra_op_threads: intraOpThreads,
    items_per_s: throughput,
    throughput_ratio_b32: throughput['c1_b32']!.ratio,
    throughput_ratio_b32_concurrency2: throughput['c2_b32']!.ratio,
    throughput_ratio_b32_ceiling: throughput['c1_b32']!.ratio_ceiling,
    worker_added_ms_b32: throughput['c1_b32']!.worker_added_ms,
    health_checks: healthMs.length,
    health_p50_ms: round(quantile(healthMs, 0.5)),
    health_p99_ms: round(quantile(healthMs, 0.99)),
    health_max_ms: round(Math.max(...healthMs)),
    health_idle_p50_ms: round(quantile(idleHealthMs, 0.5)),
    health_idle_p99_ms: round(quantile(idleHealthMs, 0.99)),
    /** The same checks of the transport-floor process, which computes nothing, meanwhile. */
    health_floor_p50_ms: round(quantile(floorHealthMs, 0.5)),
    health_floor_p99_ms: round(quantile(floorHealthMs, 0.99)),
    health_floor_idle_p99_ms: round(quantile(idleFloorHealthMs, 0.99)),
    health_p99_over_floor: round(quantile(healthMs, 0.99) / quantile(floorHealthMs, 0.99)),
  };
  process.stdout.write(
    `${table(
      [
        'concurrency',
        'batch',
        'in-process items/s',
        'worker gRPC items/s',
        'worker / in-process',
        'floor items/s',
        'ceiling',
        'worker added ms',
      ],
      CONCURRENCY.flatMap((c) =>
        BATCH_SIZES.map((b) => {
          const row = throughput[`c${c}_b${b}`]!;
          return [
            c,
            b,
            row.inprocess,
            row.worker,
            row.ratio,
            row.transport_floor,
            row.ratio_ceiling,
            row.worker_added_ms,
          ];
        }),
      ),
    )}\n\nhealth Check while the worker computes: p50 ${result.health_p50_ms} ms, p99 ${result.health_p99_ms} ms, max ${result.health_max_ms} ms (${healthMs.length} checks); idle: p50 ${result.health_idle_p50_ms} ms, p99 ${result.health_idle_p99_ms} ms; the transport-floor process meanwhile: p50 ${result.health_floor_p50_ms} ms, p99 ${result.health_floor_p99_ms} ms (idle p99 ${result.health_floor_idle_p99_ms} ms)\n`,
  );
  return result;
}
