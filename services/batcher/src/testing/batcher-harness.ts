import 'reflect-metadata';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { InferParameterSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import {
  DataType,
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { Metrics } from '@infermesh/telemetry';
import { eventually, ManualClock } from '@infermesh/testing';
import { loadBatcherConfig } from '../batcher.config';
import { BatcherModule } from '../batcher.module';
import { Scheduler, type SchedulerCall } from '../scheduler';
import { type WorkerHandle, WorkerPool } from '../worker-pool';
import { BatchingRegistry } from './batching-registry';
import { FakeWorker } from './fake-worker';

/** A request of `rows` items of [rows, width] FP32 for "mlp" version 1, each element holding its row's tag. */
export function rowsRequest(
  id: string,
  rows: number,
  tag: number,
  init: MessageInitShape<typeof InferenceRequestSchema> = {},
  width = 2,
): InferenceRequest {
  const data = new Float32Array(rows * width);
  for (let r = 0; r < rows; r++) data.fill(tag + r, r * width, (r + 1) * width);
  return create(InferenceRequestSchema, {
    modelName: 'mlp',
    modelVersion: '1',
    id,
    inputs: [
      { name: 'x', datatype: DataType.FP32, shape: [BigInt(rows), BigInt(width)], data: new Uint8Array(data.buffer) },
    ],
    ...init,
  });
}

/** The row tags of a response to rowsRequest (the fake workers echo "x" as "y"). */
export function rowsOf(response: Pick<InferenceResponse, 'outputs'>): number[] {
  const y = response.outputs.find((o) => o.name === 'y')!;
  const values = new Float32Array(Uint8Array.from(y.data).buffer);
  const width = Number(y.shape[1]);
  return Array.from({ length: Number(y.shape[0]) }, (_, r) => values[r * width]!);
}

/** The `priority` parameter of a request. */
export const priority = (level: number) => ({
  priority: create(InferParameterSchema, { parameterChoice: { case: 'int64Param', value: BigInt(level) } }),
});

/** What a gRPC call gives the scheduler: no deadline unless given, a live signal unless given. */
export const call = (options: { deadlineMs?: number; signal?: AbortSignal } = {}): SchedulerCall => ({
  requestId: 'test',
  deadlineMs: options.deadlineMs,
  signal: options.signal ?? new AbortController().signal,
});

/** A promise that resolves when opened. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

/**
 * The batcher's Nest context against two fake workers and a fake registry, served over real
 * sockets, on a ManualClock: time (deadlines, queue delays, back-off, ejections, the settings TTL)
 * moves only when a spec advances it. What settles through real I/O (a worker's answer, a poll, the
 * registry watch) is awaited, never slept for.
 */
export class BatcherHarness {
  readonly clock = new ManualClock();
  private app: INestApplicationContext | undefined;

  private constructor(
    readonly workers: [FakeWorker, FakeWorker],
    readonly registry: BatchingRegistry,
  ) {}

  static async open(): Promise<BatcherHarness> {
    const workers = await Promise.all([new FakeWorker('w1').start(), new FakeWorker('w2').start()]);
    return new BatcherHarness(workers, await new BatchingRegistry().start());
  }

  /** Starts the batcher against the fakes; the periodic poll is an hour away. */
  async start(env: Record<string, string> = {}): Promise<Scheduler> {
    const config = loadBatcherConfig({
      BATCHER_LOG_LEVEL: 'error',
      BATCHER_WORKER_ADDRESSES: this.workers.map((w) => w.address).join(','),
      BATCHER_WORKER_POLL_MS: '3600000',
      BATCHER_WORKER_TIMEOUT_MS: '1000',
      BATCHER_REGISTRY_ADDRESS: this.registry.address,
      ...env,
    });
    this.app = await NestFactory.createApplicationContext(BatcherModule.forRoot(config, { clock: this.clock }), {
      logger: false,
      abortOnError: false,
    });
    return this.app.get(Scheduler);
  }

  /** A provider of the running batcher. */
  get<T>(token: abstract new (...args: never[]) => T): T {
    if (this.app === undefined) throw new Error('the batcher is not started');
    return this.app.get(token);
  }

  /** The batcher's handle of a fake worker: its `outstanding` batches change as batches are sent and answered. */
  handleOf(worker: FakeWorker): WorkerHandle {
    const handle = this.get(WorkerPool).workers.find((w) => w.address === worker.address);
    if (handle === undefined) throw new Error(`the batcher has no worker ${worker.address}`);
    return handle;
  }

  /** Waits until the scheduler holds `count` requests, queued or on workers. */
  async inflight(count: number): Promise<void> {
    const sut = this.get(Scheduler);
    await eventually(() => sut.inflightCount() === count);
  }

  /**
   * Holds the worker on a first request ("blocker") until release(), so that what follows queues
   * behind it.
   */
  async occupy(worker: FakeWorker, tag = 0): Promise<{ blocker: Promise<InferenceResponse>; release: () => void }> {
    const held = gate();
    worker.hold = held.promise;
    const received = worker.received.length;
    const blocker = this.get(Scheduler).enqueue(rowsRequest('blocker', 1, tag), call());
    // A spec that fails while the worker holds it must not also leave its rejection at teardown unhandled.
    blocker.catch(() => undefined);
    await eventually(() => worker.received.length === received + 1);
    return {
      blocker,
      release: () => {
        held.open();
        worker.hold = undefined;
      },
    };
  }

  /**
   * Advances the clock `stepMs` at a time until `condition` holds, letting real I/O settle in
   * between: for waits whose length is drawn at random (retry back-off with jitter).
   */
  async advanceUntil(condition: () => boolean, stepMs: number): Promise<void> {
    await eventually(() => {
      if (condition()) return true;
      this.clock.advance(stepMs);
      return condition();
    });
  }

  /** The sum of a counter's or gauge's values with these labels (infermesh_batcher_ is implied). */
  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const values = await this.metricValues(name, labels);
    return values.reduce((sum, x) => sum + x.value, 0);
  }

  /** The count and sum of a histogram's observations with these labels. */
  async histogram(name: string, labels: Record<string, string> = {}): Promise<{ count: number; sum: number }> {
    const values = await this.metricValues(name, labels);
    // prom-client names each value of a histogram: its `_bucket`, `_sum` and `_count` series.
    const total = (suffix: string) =>
      values
        .filter((x) => (x as { metricName?: string }).metricName === `infermesh_batcher_${name}${suffix}`)
        .reduce((s, x) => s + x.value, 0);
    return { count: total('_count'), sum: total('_sum') };
  }

  async close(): Promise<void> {
    await this.app?.close();
    this.app = undefined;
    await Promise.all([...this.workers.map((w) => w.stop()), this.registry.stop()]);
  }

  private async metricValues(name: string, labels: Record<string, string>) {
    const found = this.get(Metrics).registry.getSingleMetric(`infermesh_batcher_${name}`);
    if (found === undefined) throw new Error(`no metric ${name}`);
    const { values } = await found.get();
    return values.filter((x) => Object.entries(labels).every(([k, l]) => x.labels[k] === l));
  }
}
