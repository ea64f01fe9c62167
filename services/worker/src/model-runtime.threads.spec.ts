import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  buildIdentityModel,
  buildMlpModel,
  buildMultiIoModel,
  buildTinyModel,
  TINY_BIAS,
  TINY_WEIGHT,
} from '@infermesh/model-builder';
import type { RpcError } from '@infermesh/grpc';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType, decodeBytesElements, encodeBytesElements } from '@infermesh/tensors';
import { eventually, ManualClock, rpcRejection as rejection } from '@infermesh/testing';
import * as ort from 'onnxruntime-node';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ModelLoadError, PREPARATION_MODEL } from './model-runtime';
import { ThreadsModelRuntime, type ThreadsModelSession } from './model-runtime.threads';

const fp32 = (name: string, values: ArrayLike<number>, shape: number[]): Tensor =>
  create(TensorSchema, {
    name,
    datatype: DataType.FP32,
    shape: shape.map(BigInt),
    data: Buffer.from(Float32Array.from(values).buffer),
  });
const int64 = (name: string, values: bigint[], shape: number[]): Tensor =>
  create(TensorSchema, {
    name,
    datatype: DataType.INT64,
    shape: shape.map(BigInt),
    data: Buffer.from(BigInt64Array.from(values).buffer),
  });
const floats = (t: Tensor) => Array.from(new Float32Array(Uint8Array.from(t.data).buffer));
const bigints = (t: Tensor) => Array.from(new BigInt64Array(Uint8Array.from(t.data).buffer));

const MLP = buildMlpModel();
const STRINGS = buildIdentityModel(['BYTES']);
const strings = (values: string[]): Tensor =>
  create(TensorSchema, {
    name: 'bytes_in',
    datatype: DataType.BYTES,
    shape: [1n, BigInt(values.length)],
    data: encodeBytesElements(values.map((v) => Buffer.from(v))),
  });
/** A batch of MLP inputs, different for each seed. */
const mlpInput = (rows: number, seed = 0) =>
  fp32(
    'input',
    Float32Array.from({ length: rows * 512 }, (_, i) => Math.sin(seed * 7919 + i)),
    [rows, 512],
  );

/** A runtime whose threads die on a run of an input named "crash" (execution-thread.crash-fixture.js). */
const crashingRuntime = (
  instancesPerModel: number,
  died: string[],
  restartDelayMs = 50,
  clock?: ManualClock,
  executionThreads?: number,
) =>
  new ThreadsModelRuntime({
    instancesPerModel,
    executionThreads,
    intraOpThreads: 1,
    onThreadCrash: (reason) => died.push(reason),
    restartDelayMs,
    threadFile: join(__dirname, 'execution-thread.crash-fixture.js'),
    clock,
  });

describe(ThreadsModelRuntime.name, () => {
  const crashes: string[] = [];
  const sut = new ThreadsModelRuntime({
    instancesPerModel: 1,
    intraOpThreads: 1,
    onThreadCrash: (reason) => crashes.push(reason),
    restartDelayMs: 50,
  });
  const two = new ThreadsModelRuntime({ instancesPerModel: 2, intraOpThreads: 1 });
  const open: ThreadsModelSession[] = [];
  const load = async (runtime: ThreadsModelRuntime, bytes: Uint8Array, providers = ['cpu']) => {
    const session = (await runtime.load(bytes, providers)) as ThreadsModelSession;
    open.push(session);
    return session;
  };
  afterEach(async () => {
    await Promise.all(open.splice(0).map((s) => s.release()));
  });
  afterAll(() => Promise.all([sut.close(), two.close()]));

  it('runs the tiny model: input · W + b', async () => {
    const session = await load(sut, buildTinyModel().bytes);
    const x = [1, 2, 3, 4, -1, 0.5, 0, 2];
    const {
      outputs: [output],
    } = await session.run([fp32('input', x, [2, 4])], []);
    expect(output!.name).toBe('output');
    expect(output!.datatype).toBe(DataType.FP32);
    expect(output!.shape).toEqual([2n, 3n]);
    const expected = [0, 1].flatMap((r) =>
      [0, 1, 2].map(
        (o) => TINY_BIAS[o]! + [0, 1, 2, 3].reduce((sum, i) => sum + x[r * 4 + i]! * TINY_WEIGHT[i * 3 + o]!, 0),
      ),
    );
    floats(output!).forEach((v, i) => expect(v).toBeCloseTo(expected[i]!, 5));
  });

  it('gives the same bytes as onnxruntime-node run in-process', async () => {
    const session = await load(sut, MLP.bytes);
    const reference = await ort.InferenceSession.create(MLP.bytes, {
      intraOpNumThreads: 1,
      interOpNumThreads: 1,
      graphOptimizationLevel: 'all',
    });
    try {
      for (const rows of [1, 8, 33]) {
        const input = mlpInput(rows, rows);
        const {
          outputs: [output],
        } = await session.run([input], []);
        const expected = (
          await reference.run({
            input: new ort.Tensor('float32', new Float32Array(Uint8Array.from(input.data).buffer), [rows, 512]),
          })
        )[reference.outputNames[0]!]!;
        const bytes = expected.data as Float32Array;
        expect(output!.shape).toEqual(expected.dims.map(BigInt));
        expect(Buffer.from(output!.data).equals(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength))).toBe(
          true,
        );
      }
    } finally {
      await reference.release();
    }
  });

  it('reads the signature from the model, -1 for the dynamic batch dimension', async () => {
    const session = await load(sut, buildMultiIoModel().bytes);
    expect(session.inputs.map((s) => [s.name, s.datatype, s.shape])).toEqual([
      ['x', DataType.FP32, [-1n, 4n]],
      ['ids', DataType.INT64, [-1n, 2n]],
    ]);
    expect(session.outputs.map((s) => [s.name, s.datatype])).toEqual([
      ['y', DataType.FP32],
      ['ids_plus_one', DataType.INT64],
      ['positive', DataType.BOOL],
    ]);
  });

  it('runs the multi-io model, every output in its own datatype', async () => {
    const session = await load(sut, buildMultiIoModel().bytes);
    const { outputs } = await session.run(
      [fp32('x', [1, -2, 0, 3.5, -0.5, 4, 5, -6], [2, 4]), int64('ids', [0n, 41n, -1n, 2n ** 62n], [2, 2])],
      [],
    );
    expect(outputs.map((o) => o.name)).toEqual(['y', 'ids_plus_one', 'positive']);
    expect(floats(outputs[0]!)).toEqual([2, -4, 0, 7, -1, 8, 10, -12]);
    expect(bigints(outputs[1]!)).toEqual([1n, 42n, 0n, 2n ** 62n + 1n]);
    expect(outputs[2]!.datatype).toBe(DataType.BOOL);
    expect(Array.from(outputs[2]!.data)).toEqual([1, 0, 0, 1, 0, 1, 1, 0]);
    expect(outputs[2]!.shape).toEqual([2n, 4n]);
  });

  it('returns only the outputs asked for, in the order asked', async () => {
    const session = await load(sut, buildMultiIoModel().bytes);
    const { outputs } = await session.run(
      [fp32('x', [1, -1, 1, -1], [1, 4]), int64('ids', [7n, 8n], [1, 2])],
      ['positive', 'ids_plus_one'],
    );
    expect(outputs.map((o) => o.name)).toEqual(['positive', 'ids_plus_one']);
    expect(Array.from(outputs[0]!.data)).toEqual([1, 0, 1, 0]);
  });

  it('answers INVALID_ARGUMENT for an unknown output and for input the model refuses, and keeps serving', async () => {
    const session = await load(sut, buildTinyModel().bytes);
    const unknown = await rejection(session.run([fp32('input', [1, 2, 3, 4], [1, 4])], ['logits']));
    expect(unknown.code).toBe(status.INVALID_ARGUMENT);
    expect(unknown.message).toMatch(/"logits"/);
    const refused = await rejection(session.run([fp32('input', [1, 2, 3], [1, 3])], []));
    expect(refused.code).toBe(status.INVALID_ARGUMENT);
    expect(refused.reason).toBe('INVALID_TENSOR');
    expect((await session.run([fp32('input', [1, 2, 3, 4], [1, 4])], [])).outputs).toHaveLength(1);
  });

  it('falls back to the next execution provider and records the one that created the session', async () => {
    const session = await load(sut, buildTinyModel().bytes, ['no-such-provider', 'cpu']);
    expect(session.executionProvider).toBe('cpu');
    expect((await session.run([fp32('input', [1, 2, 3, 4], [1, 4])], [])).outputs).toHaveLength(1);
  });

  it("fails with every provider's reason when none can load the model", async () => {
    await expect(sut.load(Buffer.from('not an onnx model'), ['no-such-provider', 'cpu'])).rejects.toThrow(
      ModelLoadError,
    );
    await expect(sut.load(Buffer.from('not an onnx model'), ['cpu'])).rejects.toThrow(/cpu: /);
  });

  it('keeps the event loop responsive while a long batch runs', async () => {
    const session = await load(sut, MLP.bytes);
    const input = mlpInput(1024);
    await session.run([input], []); // warm
    // Counted, not timed (a busy machine stretches every gap): a run on the event loop would let at
    // most one turn of it go by before it ends, one in a thread lets it turn freely meanwhile.
    let turns = 0;
    let ticking = true;
    const tick = () => {
      turns += 1;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    await session.run([input], []);
    ticking = false;
    expect(turns).toBeGreaterThan(10);
  });

  it('replaces a thread that dies: only its request fails, UNAVAILABLE (EXECUTION_FAILED), and the model serves on', async () => {
    const died: string[] = [];
    const crashing = crashingRuntime(2, died);
    const session = await load(crashing, MLP.bytes);
    const before = [...session.threads];

    const [crashed, other] = await Promise.allSettled([
      session.run([fp32('crash', [0], [1])], []),
      session.run([mlpInput(64)], []),
    ]);

    expect(crashed.status).toBe('rejected');
    const error = (crashed as PromiseRejectedResult).reason as RpcError;
    expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'EXECUTION_FAILED']);
    expect(other.status).toBe('fulfilled');
    expect(died).toHaveLength(1);
    expect(died[0]).toContain('70');
    await eventually(() => session.occupancy.instances === 2); // the replacement thread has started
    expect(session.threads.filter((t) => before.includes(t))).toHaveLength(1);
    const runs = await Promise.all([0, 1, 2, 3].map((i) => session.run([mlpInput(8, i)], [])));
    expect(runs.every((r) => r.outputs[0]!.shape[0] === 8n)).toBe(true);
  });

  it('lets go of the model bytes once its instances run, and reloads them only to replace a thread that dies', async () => {
    const died: string[] = [];
    const crashing = crashingRuntime(1, died);
    let reloads = 0;
    const session = (await crashing.load(buildTinyModel().bytes, ['cpu'], async () => {
      reloads += 1;
      return buildTinyModel().bytes;
    })) as ThreadsModelSession;
    open.push(session);
    expect(session.holdsModelBytes).toBe(false);
    expect(reloads).toBe(0);

    await rejection(session.run([fp32('crash', [0], [1])], []));
    const result = await session.run([fp32('input', [1, 2, 3, 4], [1, 4])], []); // waits for the replacement

    expect(reloads).toBe(1);
    expect(died).toHaveLength(1);
    expect(floats(result.outputs[0]!)).toHaveLength(3);
    expect(session.holdsModelBytes).toBe(false);
  });

  it('holds no copy of the model in its threads once their sessions exist', async () => {
    const session = await load(two, MLP.bytes); // 24 MiB of weights

    for (const thread of session.threads) {
      // What a thread's JavaScript holds outside its heap: its clone of the model until it frees it.
      expect((await thread.getHeapStatistics()).external_memory).toBeLessThan(MLP.bytes.byteLength / 4);
    }
    expect(floats((await session.run([mlpInput(2)], [])).outputs[0]!)).toHaveLength(2 * 512);
  });

  it('keeps the model bytes without a way to reload them; a failed reload leaves waiting requests UNAVAILABLE, not hanging', async () => {
    expect((await load(sut, buildTinyModel().bytes)).holdsModelBytes).toBe(true);

    const died: string[] = [];
    const clock = new ManualClock();
    const crashing = crashingRuntime(1, died, 60_000, clock);
    const session = (await crashing.load(buildTinyModel().bytes, ['cpu'], () =>
      Promise.reject(new Error('artifact refused: bytes hash to 00')),
    )) as ThreadsModelSession;
    open.push(session);
    const crashed = session.run([fp32('crash', [0], [1])], []);
    const waiting = session.run([fp32('input', [1, 2, 3, 4], [1, 4])], []);

    expect((await rejection(crashed)).code).toBe(status.UNAVAILABLE);
    const error = await rejection(waiting);
    expect([error.code, error.reason]).toEqual([status.UNAVAILABLE, 'EXECUTION_FAILED']);
    expect(error.message).toContain('artifact refused');
    expect(died.at(-1)).toContain('a replacement execution thread failed to start: artifact refused');
    expect(clock.pendingInMs()).toEqual([60_000]); // it tries again after restartDelayMs
  });

  it('runs requests on two instances at once', async () => {
    const session = await load(two, MLP.bytes);
    expect(session.occupancy).toEqual({ busy: 0, instances: 2, queued: 0 });
    const runs = [0, 1, 2].map((i) => session.run([mlpInput(64, i)], []));
    expect(session.occupancy).toEqual({ busy: 2, instances: 2, queued: 1 });
    const results = await Promise.all(runs);
    expect(session.occupancy).toEqual({ busy: 0, instances: 2, queued: 0 });
    const alone = await session.run([mlpInput(64, 2)], []);
    expect(Buffer.from(results[2]!.outputs[0]!.data).equals(Buffer.from(alone.outputs[0]!.data))).toBe(true);
  });

  it('queues requests for a busy instance first in, first out', async () => {
    const session = await load(sut, MLP.bytes);
    const order: number[] = [];
    const runs = [0, 1, 2, 3].map((i) => session.run([mlpInput(16, i)], []).then(() => order.push(i)));
    expect(session.occupancy).toEqual({ busy: 1, instances: 1, queued: 3 });
    await Promise.all(runs);
    expect(order).toEqual([0, 1, 2, 3]);
  });

  it('passes BYTES elements through the thread: UTF-8, empty and long strings', async () => {
    const session = await load(sut, STRINGS.bytes);
    const values = ['é', '', '日本語', 'x'.repeat(70_000)];
    const {
      outputs: [output],
    } = await session.run([strings(values)], []);
    expect(output!.datatype).toBe(DataType.BYTES);
    expect(output!.shape).toEqual([1n, 4n]);
    expect(decodeBytesElements(output!.data)!.map((b) => b.toString('utf8'))).toEqual(values);
  });

  it('lets a run in progress finish when the session is released; the thread stays to serve other models', async () => {
    const session = await load(sut, MLP.bytes);
    const [thread] = session.threads;
    const running = session.run([mlpInput(512)], []);
    await session.release();
    const {
      outputs: [output],
    } = await running;
    expect(output!.shape).toEqual([512n, 512n]);
    const next = await load(sut, buildTinyModel().bytes);
    expect(next.threads).toEqual([thread]);
    expect((await next.run([fp32('input', [1, 2, 3, 4], [1, 4])], [])).outputs).toHaveLength(1);
  });

  it('refuses a BF16 tensor with UNIMPLEMENTED naming the tensor', async () => {
    const session = await load(sut, buildTinyModel().bytes);
    const bf16 = create(TensorSchema, {
      name: 'input',
      datatype: DataType.BF16,
      shape: [1n, 4n],
      data: new Uint8Array(8),
    });
    const error = await rejection(session.run([bf16], []));
    expect([error.code, error.reason]).toEqual([status.UNIMPLEMENTED, 'DATATYPE_UNSUPPORTED']);
    expect(error.message).toMatch(/tensor "input": datatype BF16 is not supported/);
  });

  it('frees the model on release and refuses to run after; its threads serve the next model', async () => {
    const session = await load(two, buildTinyModel().bytes);
    const threads = session.threads;
    expect(threads).toHaveLength(2);
    await session.release();
    expect(session.occupancy).toEqual({ busy: 0, instances: 0, queued: 0 });
    const error = await rejection(session.run([fp32('input', [1, 2, 3, 4], [1, 4])], []));
    expect(error.code).toBe(status.UNAVAILABLE);
    const next = await load(two, buildTinyModel().bytes);
    expect(new Set(next.threads)).toEqual(new Set(threads));
  });

  it('runs the compute computeNice steps below the main thread, its operator threads too, and leaves the main thread as it was', async () => {
    const niceOf = () =>
      readdirSync('/proc/self/task').map((tid) => {
        const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
        return { tid: Number(tid), nice: Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[16]) };
      });
    const before = new Set(niceOf().map((t) => t.tid));
    const main = niceOf().find((t) => t.tid === process.pid)!.nice;
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 2, computeNice: 7 });
    try {
      const session = (await runtime.load(MLP.bytes, ['cpu'])) as ThreadsModelSession;
      await session.run([mlpInput(8)], []);
      const started = niceOf().filter((t) => !before.has(t.tid));
      // The execution thread and the operator thread onnxruntime started from it (one besides the
      // caller's, with 2 intra-op threads).
      expect(started.filter((t) => t.nice === Math.min(19, main + 7)).length).toBeGreaterThanOrEqual(2);
      expect(niceOf().find((t) => t.tid === process.pid)!.nice).toBe(main);
      await session.release();
    } finally {
      await runtime.close();
    }
  });

  it("gives a session the operator threads its load asks for, else the runtime's", async () => {
    const tasks = () => new Set(readdirSync('/proc/self/task'));
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 1 });
    try {
      // Each load starts an execution thread of its own, and onnxruntime starts from it the session's
      // operator threads but one (the execution thread computes too).
      const started = async (load: () => Promise<unknown>) => {
        const before = tasks();
        const session = (await load()) as ThreadsModelSession;
        await session.run([mlpInput(64)], []);
        return [...tasks()].filter((tid) => !before.has(tid)).length;
      };
      // The first load also starts what the runtime starts once.
      await started(() => runtime.load(MLP.bytes, ['cpu']));
      expect(await started(() => runtime.load(MLP.bytes, ['cpu']))).toBe(1);
      expect(await started(() => runtime.load(MLP.bytes, ['cpu'], undefined, { intraOpThreads: 3 }))).toBe(3);
    } finally {
      await runtime.close();
    }
  });

  it("runs each model on threads of its own: one model's request does not wait for another's run", async () => {
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 1 });
    try {
      await runtime.prepare(['cpu']);
      const mlp = (await runtime.load(MLP.bytes, ['cpu'])) as ThreadsModelSession;
      const tiny = (await runtime.load(buildTinyModel().bytes, ['cpu'])) as ThreadsModelSession;
      expect(runtime.threadCount).toBe(2);
      expect(tiny.threads[0]).not.toBe(mlp.threads[0]);
      // A large batch of the MLP computes for tens of milliseconds; the tiny model answers meanwhile.
      const order: string[] = [];
      const big = mlp.run([mlpInput(1024)], []).then(() => order.push('mlp'));
      await tiny.run([fp32('input', [1, 2, 3, 4], [1, 4])], []).then(() => order.push('tiny'));
      await big;
      expect(order).toEqual(['tiny', 'mlp']);
      // The thread started for the tiny model ends with it; the prepared one stays.
      await tiny.release();
      await eventually(() => runtime.threadCount === 1);
      await mlp.release();
      expect(runtime.threadCount).toBe(1);
    } finally {
      await runtime.close();
    }
  });

  it('shares threads among models past executionThreads: each model within its instances, one run at a time per thread', async () => {
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 2, executionThreads: 2, intraOpThreads: 1 });
    try {
      const first = (await runtime.load(MLP.bytes, ['cpu'])) as ThreadsModelSession;
      const second = (await runtime.load(buildTinyModel().bytes, ['cpu'])) as ThreadsModelSession;
      expect(runtime.threadCount).toBe(2);
      expect(new Set(first.threads).size).toBe(2);
      expect(new Set(second.threads)).toEqual(new Set(first.threads));
      const runs = [0, 1, 2].map((i) => first.run([mlpInput(64, i)], []));
      const tiny = second.run([fp32('input', [1, 2, 3, 4], [1, 4])], []);
      expect(first.occupancy).toEqual({ busy: 2, instances: 2, queued: 1 });
      expect(second.occupancy).toEqual({ busy: 1, instances: 2, queued: 0 });
      await Promise.all([...runs, tiny]);
      await Promise.all([first.release(), second.release()]);
      expect(runtime.threadCount).toBe(2); // never fewer than one model's instances
    } finally {
      await runtime.close();
    }
  });

  it("starts one model's threads in prepare(), one for each further instance up to the limit, then shares", async () => {
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 1, executionThreads: 3, intraOpThreads: 1 });
    const wide = new ThreadsModelRuntime({ instancesPerModel: 2, intraOpThreads: 1 });
    try {
      expect(runtime.threadCount).toBe(0);
      await runtime.prepare(['cpu']);
      expect(runtime.threadCount).toBe(1);
      const sessions = await Promise.all([0, 1, 2, 3].map(() => runtime.load(buildTinyModel().bytes, ['cpu'])));
      expect(runtime.threadCount).toBe(3);
      const threads = sessions.map((s) => (s as ThreadsModelSession).threads[0]);
      expect(new Set(threads).size).toBe(3); // the fourth shares one of the three
      await Promise.all(sessions.map((s) => s.release()));
      await eventually(() => runtime.threadCount === 1);

      // Without prepare(), the first load starts the threads its instances need.
      const session = await wide.load(buildTinyModel().bytes, ['cpu']);
      expect(wide.threadCount).toBe(2);
      await session.release();
    } finally {
      await Promise.all([runtime.close(), wide.close()]);
    }
  });

  it('a thread that dies fails only its running requests; every model it hosted loads its instance again', async () => {
    const died: string[] = [];
    const crashing = crashingRuntime(1, died, 50, undefined, 1);
    try {
      const mlp = (await crashing.load(MLP.bytes, ['cpu'])) as ThreadsModelSession;
      const tiny = (await crashing.load(buildTinyModel().bytes, ['cpu'])) as ThreadsModelSession;
      expect(tiny.threads).toEqual(mlp.threads);
      const [before] = mlp.threads;

      const crashed = await rejection(tiny.run([fp32('crash', [0], [1])], []));
      expect([crashed.code, crashed.reason]).toEqual([status.UNAVAILABLE, 'EXECUTION_FAILED']);
      // Both models serve again, on the replacement thread.
      const [big, small] = await Promise.all([
        mlp.run([mlpInput(4)], []),
        tiny.run([fp32('input', [1, 2, 3, 4], [1, 4])], []),
      ]);
      expect(big.outputs[0]!.shape).toEqual([4n, 512n]);
      expect(floats(small.outputs[0]!)).toHaveLength(3);
      expect(died).toHaveLength(1);
      expect(crashing.threadCount).toBe(1);
      expect(mlp.threads).toEqual(tiny.threads);
      expect(mlp.threads[0]).not.toBe(before);
      await Promise.all([mlp.release(), tiny.release()]);
    } finally {
      await crashing.close();
    }
  });
});

describe('PREPARATION_MODEL', () => {
  it('is the identity model the model builder writes', () => {
    expect(Buffer.from(buildIdentityModel(['FP32'], 'runtime-preparation').bytes).equals(PREPARATION_MODEL)).toBe(true);
  });
});
