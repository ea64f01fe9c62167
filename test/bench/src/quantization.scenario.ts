import { create, toBinary } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildCnnModel, CNN_INPUT_SHAPE, INTEGER_PROBE_EXACT } from '@infermesh/model-builder';
import { integerProbeAnswer } from '@infermesh/testing';
import {
  type ModelVersion,
  RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { InferRequestSchema, ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { DataType } from '@infermesh/tensors';
import * as ort from 'onnxruntime-node';
import { availableParallelism, cpus } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFixture } from '../../e2e/support/system-fixture';
import { workerSession } from './in-process';
import { LoadClient } from './raw-infer';
import { rssBytes } from './closed-loop';
import { round, table } from './stats';

const BATCH = 32;
/** Requests kept in flight to the worker for its throughput: enough that it never waits for the next one. */
const CONCURRENCY = 4;
/**
 * Calls each of the CONCURRENCY clients makes in a row in one round of a path (each sends its next
 * as soon as its answer comes), so that the worker waits for work only at the round's start and end;
 * one in flight: one client, the same number of calls. In-process: CONCURRENCY × CALLS_PER_CLIENT
 * runs one after the other. Each round's start (the worker idle until the first request arrives)
 * and end (fewer than CONCURRENCY in flight) are not the worker's throughput, and weigh most on the
 * fastest model: at 4 calls a client a round of the int8 MLP lasted about 35 ms. Its items/s ratio to
 * its source averaged 1.74 over eight runs at 4 calls a client, 1.79 over seven at 16 (within this
 * machine's spread: 1.56 to 1.88, and 1.58 to 2.02).
 */
const CALLS_PER_CLIENT = 16;
const WARMUP_ROUNDS = 3;
/**
 * Rounds per model and path, each of CONCURRENCY × CALLS_PER_CLIENT calls of BATCH items: about
 * 120,000 items of the MLP (about 19 s of its source's and variant's rounds at 4 in flight; at 20
 * rounds, about 6 s, ten runs on one machine in one evening gave items ratios of 1.72 to 2.02), 8,000
 * of the CNN.
 */
const ROUNDS: Record<string, number> = { mlp: 60, cnn: 4 };
const RUNS_PER_ROUND = CONCURRENCY * CALLS_PER_CLIENT;
const INFER_PATH = `/${WorkerService.typeName}/Infer`;
/** The models whose unloading is measured, each on a worker of its own that serves no request. */
const UNLOADED = ['mlp', 'mlp-int8'] as const;
/** How long after a model is unloaded the worker's resident memory is read: its sessions are freed by then (the execution threads stay, the worker's). */
const UNLOAD_SETTLE_MS = 1_000;

interface Pair {
  /** The figures' prefix. */
  key: string;
  source: string;
  variant: string;
  /** The shape of one item. */
  item: readonly number[];
  /** The variant registered with these operator threads (`--intra-op-threads`); unset: the worker's. */
  variantIntraOpThreads?: number;
}

/**
 * Int8 variants derived by the registry (QuantizeModelVersion, as `infermesh models quantize` asks
 * for them) against their FP32 sources, each model served by a worker of its own (the worker's
 * defaults on this machine: one instance per model with every core):
 * - items/s at batch 32 through WorkerService.Infer with CONCURRENCY requests in flight (the worker's
 *   throughput) and with one (a caller that waits for each answer), source and variant measured
 *   alternately round by round, each worker called by the benchmarks' own client (LoadClient: its HTTP/2
 *   window open as the services' clients open theirs, on a connection of its own);
 * - the memory the worker charges each (its memory_bytes), and the same beyond what an instance of
 *   the tiny model costs (the part of a charge that does not depend on the model);
 * - the artifact sizes, and the relative L2 error the registry recorded at derivation;
 * - for the MLP and its variant, how much of the worker's resident memory unloading gives back;
 * - beside them, the same two models in-process (onnxruntime-node with the worker's session
 *   settings), so that the worker's ratio can be read against the runtime's own.
 * Models: the demo MLP (512-2048-2048-512), its variant twice: with the worker's operator threads and
 * registered with one (`--intra-op-threads 1`, mlp_one_thread_*), and the generated CNN (3×48×192
 * input) twice: with its convolutions in float (the default) and quantized too (--conv).
 */
export async function quantization(): Promise<Record<string, unknown>> {
  const intraOpThreads = availableParallelism();
  const cnn = { ...buildCnnModel(), name: 'cnn' };
  const pairs: Pair[] = [
    { key: 'mlp', source: 'mlp', variant: 'mlp-int8', item: [512] },
    { key: 'mlp_one_thread', source: 'mlp', variant: 'mlp-int8-1t', item: [512], variantIntraOpThreads: 1 },
    { key: 'cnn', source: 'cnn', variant: 'cnn-int8', item: CNN_INPUT_SHAPE },
    { key: 'cnn_conv', source: 'cnn', variant: 'cnn-int8-conv', item: CNN_INPUT_SHAPE },
  ];
  // Each model in a worker process of its own: what a worker charges for a load depends on what the
  // process held and freed before it (memory freed by an earlier load is used again without growing
  // the process), so each is measured as the only model of a fresh worker.
  // The tiny model (12 weights) in a worker of its own too: what an execution instance costs with
  // (almost) no model, so that each charge can also be read beyond that fixed part.
  const served = [...new Set(pairs.flatMap((p) => [p.source, p.variant])), 'tiny'];
  const fixture = await startFixture({
    models: ['mlp', cnn, 'tiny'],
    env: {
      ROUTER_CACHE_ENABLED: 'false',
      WORKER_INSTANCES_PER_MODEL: '1',
      WORKER_INTRA_OP_THREADS: String(intraOpThreads),
    },
    // Then a quiet worker each for the MLP and its variant, never sent a request: what unloading gives
    // back is read there, not where the load's garbage also comes and goes.
    workers: [...served, ...UNLOADED].map((model) => ({ models: [model] })),
  });
  const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
  const workers = new Map(
    served.map((model, i) => [model, createClient(WorkerService, fixture.system.workerGrpcAddress(i))]),
  );
  const raw = new Map(served.map((model, i) => [model, new LoadClient(fixture.system.workerGrpcAddress(i))]));
  const sessions: ort.InferenceSession[] = [];
  try {
    const derived: Record<string, ModelVersion> = {};
    for (const pair of pairs) {
      const { version } = await registry.quantizeModelVersion(
        {
          source: `models/${pair.source}/versions/1`,
          targetModel: `models/${pair.variant}`,
          settings: { quantizeConv: pair.key === 'cnn_conv' },
          ...(pair.variantIntraOpThreads !== undefined && {
            execution: { intraOpThreads: pair.variantIntraOpThreads },
          }),
        },
        { timeoutMs: 120_000 },
      );
      derived[pair.key] = version!;
      await waitReady(registry, pair.variant);
    }
    const memory = new Map<string, number>();
    for (const client of workers.values()) {
      for (const m of (await client.listModels({})).models) memory.set(m.name, Number(m.memoryBytes));
    }
    const instanceBytes = memory.get('models/tiny/versions/1')!;
    const sizes = new Map<string, number>();
    for (const m of (await registry.listModels({})).models)
      sizes.set(m.name, Number(m.versions[0]!.artifact!.sizeBytes));

    const figures: Record<string, number> = {};
    const rows: (string | number)[][] = [];
    for (const pair of pairs) {
      const itemElements = pair.item.reduce((a, b) => a * b, 1);
      const input = new Float32Array(BATCH * itemElements);
      for (let i = 0; i < input.length; i++) input[i] = Math.sin(i * 0.37);
      const shape = [BATCH, ...pair.item];
      // The load generator shares this machine's two cores with the worker: it sends one request
      // encoded once and reads only the size of each answer, so that its own protobuf work (about
      // 1.7 ms of CPU a call at this size, measured) does not take the worker's CPU.
      const encoded = (model: string) =>
        Buffer.from(
          toBinary(
            InferRequestSchema,
            create(InferRequestSchema, {
              request: {
                modelName: model,
                modelVersion: '1',
                inputs: [
                  {
                    name: 'input',
                    datatype: DataType.FP32,
                    shape: shape.map(BigInt),
                    data: new Uint8Array(input.buffer),
                  },
                ],
              },
            }),
          ),
        );
      const viaWorker = (model: string, concurrency: number) => {
        const payload = encoded(model);
        const one = () =>
          raw
            .get(model)!
            .call(INFER_PATH, payload, 60_000)
            .then(
              (answer) => {
                if (answer.length < BATCH * 4) throw new Error(`${model} answered ${answer.length} bytes`);
              },
              (error: Error) => {
                throw new Error(`${model}: ${error.message}`);
              },
            );
        const client = async () => {
          for (let call = 0; call < CALLS_PER_CLIENT; call++) await one();
        };
        return async () => void (await Promise.all(Array.from({ length: concurrency }, client)));
      };
      const inProcess = async (model: string, threads = intraOpThreads) => {
        const session = await workerSession(await download(registry, model), threads);
        sessions.push(session);
        const feeds = { input: new ort.Tensor('float32', input, shape) };
        return async () => {
          for (let run = 0; run < RUNS_PER_ROUND; run++) await session.run(feeds);
        };
      };
      const paths = {
        source_worker: viaWorker(pair.source, CONCURRENCY),
        variant_worker: viaWorker(pair.variant, CONCURRENCY),
        source_worker_c1: viaWorker(pair.source, 1),
        variant_worker_c1: viaWorker(pair.variant, 1),
        source_inprocess: await inProcess(pair.source),
        variant_inprocess: await inProcess(pair.variant, pair.variantIntraOpThreads),
      };
      const elapsed = {
        source_worker: 0,
        variant_worker: 0,
        source_worker_c1: 0,
        variant_worker_c1: 0,
        source_inprocess: 0,
        variant_inprocess: 0,
      };
      /** This process's CPU seconds in the variant's in-process rounds (its operator threads included). */
      let variantInProcessCpu = 0;
      const n = ROUNDS[pair.source]!;
      for (let i = 0; i < WARMUP_ROUNDS + n; i++) {
        for (const name of Object.keys(paths) as (keyof typeof paths)[]) {
          const start = process.hrtime.bigint();
          const cpu = process.cpuUsage();
          await paths[name]();
          if (i < WARMUP_ROUNDS) continue;
          elapsed[name] += Number(process.hrtime.bigint() - start) / 1e9;
          if (name === 'variant_inprocess') {
            const { user, system } = process.cpuUsage(cpu);
            variantInProcessCpu += (user + system) / 1e6;
          }
        }
      }
      const itemsPerS = (seconds: number) => (BATCH * n * RUNS_PER_ROUND) / seconds;
      const msPerRun = (seconds: number) => round((1000 * seconds) / (n * RUNS_PER_ROUND), 3);
      const accuracy = derived[pair.key]!.lineage!.accuracy!;
      const sourceName = `models/${pair.source}/versions/1`;
      const variantName = `models/${pair.variant}/versions/1`;
      Object.assign(figures, {
        [`${pair.key}_items_ratio_b32`]: round(elapsed.source_worker / elapsed.variant_worker),
        [`${pair.key}_memory_ratio`]: round(memory.get(variantName)! / memory.get(sourceName)!),
        [`${pair.key}_memory_ratio_beyond_instance`]: round(
          (memory.get(variantName)! - instanceBytes) / (memory.get(sourceName)! - instanceBytes),
        ),
        [`${pair.key}_rel_l2`]: round(accuracy.relativeL2, 5),
        [`${pair.key}_items_ratio_b32_one_in_flight`]: round(elapsed.source_worker_c1 / elapsed.variant_worker_c1),
        [`${pair.key}_inprocess_items_ratio_b32`]: round(elapsed.source_inprocess / elapsed.variant_inprocess),
        // A batch of the variant in-process: how long it takes, and the CPU it takes on every thread.
        [`${pair.key}_variant_inprocess_ms_b32`]: msPerRun(elapsed.variant_inprocess),
        [`${pair.key}_variant_inprocess_cpu_ms_b32`]: msPerRun(variantInProcessCpu),
        [`${pair.key}_artifact_ratio`]: round(
          sizes.get(`models/${pair.variant}`)! / sizes.get(`models/${pair.source}`)!,
        ),
        [`${pair.key}_source_items_per_s_b32`]: round(itemsPerS(elapsed.source_worker), 1),
        [`${pair.key}_variant_items_per_s_b32`]: round(itemsPerS(elapsed.variant_worker), 1),
        [`${pair.key}_source_memory_mib`]: round(memory.get(sourceName)! / 2 ** 20, 1),
        [`${pair.key}_variant_memory_mib`]: round(memory.get(variantName)! / 2 ** 20, 1),
      });
      rows.push([
        `${pair.source} -> ${pair.variant}`,
        round(itemsPerS(elapsed.source_worker), 1),
        round(itemsPerS(elapsed.variant_worker), 1),
        figures[`${pair.key}_items_ratio_b32`]!,
        figures[`${pair.key}_items_ratio_b32_one_in_flight`]!,
        figures[`${pair.key}_inprocess_items_ratio_b32`]!,
        `${figures[`${pair.key}_source_memory_mib`]} -> ${figures[`${pair.key}_variant_memory_mib`]}`,
        figures[`${pair.key}_memory_ratio`]!,
        figures[`${pair.key}_rel_l2`]!,
      ]);
    }
    // What unloading gives back: the quiet worker's resident memory before and after its model (its
    // only one) is unloaded through the registry (as `infermesh models unload` does, so that the
    // worker does not load it again), beside what it charged the load.
    for (const [i, model] of UNLOADED.entries()) {
      const key = model === 'mlp' ? 'mlp_source' : 'mlp_variant';
      const name = `models/${model}/versions/1`;
      const quiet = served.length + i;
      const pid = fixture.system.workerProcess(quiet).pid!;
      const worker = createClient(WorkerService, fixture.system.workerGrpcAddress(quiet));
      try {
        const { memoryBytes } = await waitWorkerState(worker, name, ModelState.READY);
        const before = rssBytes(pid);
        await registry.updateModel({
          model: { name: `models/${model}`, unloaded: true },
          updateMask: { paths: ['unloaded'] },
        });
        await waitWorkerState(worker, name, ModelState.UNLOADED);
        await sleep(UNLOAD_SETTLE_MS);
        const returned = before - rssBytes(pid);
        figures[`${key}_unload_returned_mib`] = round(returned / 2 ** 20, 1);
        figures[`${key}_unload_charge_mib`] = round(Number(memoryBytes) / 2 ** 20, 1);
      } finally {
        worker.close();
      }
    }
    process.stdout.write(
      `${table(['source -> int8 variant', 'source items/s', 'variant items/s', 'items ratio', 'one in flight', 'in-process ratio', 'worker memory MiB', 'memory ratio', 'rel L2'], rows)}\n`,
    );
    process.stdout.write(
      `unloading gave back ${figures['mlp_source_unload_returned_mib']} MiB of the MLP's ${figures['mlp_source_unload_charge_mib']} MiB charge, ${figures['mlp_variant_unload_returned_mib']} of its variant's ${figures['mlp_variant_unload_charge_mib']}\n`,
    );
    return {
      scenario: 'quantization',
      batch: BATCH,
      intra_op_threads: intraOpThreads,
      cpu: cpus()[0]?.model ?? 'unknown',
      integer_kernel_saturates: (await integerProbeAnswer()) !== INTEGER_PROBE_EXACT,
      empty_instance_memory_mib: round(instanceBytes / 2 ** 20, 1),
      ...figures,
    };
  } finally {
    for (const session of sessions) await session.release();
    registry.close();
    for (const client of workers.values()) client.close();
    for (const client of raw.values()) client.close();
    await fixture.stop();
  }
}

/** The worker's entry for a model version once it is in `state` (a version it no longer lists counts as UNLOADED). */
async function waitWorkerState(
  worker: ReturnType<typeof createClient<typeof WorkerService>>,
  name: string,
  state: ModelState,
): Promise<{ memoryBytes: bigint }> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const entry = (await worker.listModels({})).models.find((m) => m.name === name);
    if ((entry?.state ?? ModelState.UNLOADED) === state) return { memoryBytes: entry?.memoryBytes ?? 0n };
    await sleep(100);
  }
  throw new Error(`${name} was not ${ModelState[state]} on its worker within 60 s`);
}

async function waitReady(
  registry: ReturnType<typeof createClient<typeof RegistryService>>,
  model: string,
): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (Date.now() < deadline) {
    const { model: found } = await registry.getModel({ name: `models/${model}` });
    const state = found?.versions[0]?.state;
    if (state === VersionState.READY) return;
    if (state === VersionState.FAILED) throw new Error(`${model} failed to load: ${found?.versions[0]?.stateReason}`);
    await sleep(100);
  }
  throw new Error(`${model} was not READY within 120 s`);
}

async function download(
  registry: ReturnType<typeof createClient<typeof RegistryService>>,
  model: string,
): Promise<Uint8Array> {
  const { model: found } = await registry.getModel({ name: `models/${model}` });
  const chunks: Uint8Array[] = [];
  for await (const { chunk } of registry.downloadArtifact({ sha256: found!.versions[0]!.artifact!.sha256 }))
    chunks.push(chunk);
  return new Uint8Array(Buffer.concat(chunks));
}
