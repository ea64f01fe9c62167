import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { buildMultiIoModel } from '@infermesh/model-builder';
import { InferenceRequestSchema, type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { DataType } from '@infermesh/tensors';
import { Metrics } from '@infermesh/telemetry';
import { InferenceExecutor } from './inference-executor';
import { OrtModelRuntime } from './model-runtime.ort';
import { ModelTable, versionName, WorkerModel } from './model-table';
import { rpcRejection } from '@infermesh/testing';

const x = (rows: number): Tensor =>
  create(TensorSchema, { name: 'x', datatype: DataType.FP32, shape: [BigInt(rows), 4n], data: Buffer.from(new Float32Array(rows * 4).fill(1.5).buffer) });
const ids = (rows: number): Tensor =>
  create(TensorSchema, { name: 'ids', datatype: DataType.INT64, shape: [BigInt(rows), 2n], data: Buffer.from(new BigInt64Array(rows * 2).fill(9n).buffer) });
const request = (model: string, version: string, inputs: Tensor[], outputNames: string[] = []) =>
  create(InferenceRequestSchema, { modelName: model, modelVersion: version, id: 'req-7', inputs, outputNames });


describe(InferenceExecutor.name, () => {
  let table: ModelTable;
  let sut: InferenceExecutor;
  let ready: WorkerModel;

  beforeEach(async () => {
    const metrics = new Metrics('worker');
    table = new ModelTable(metrics);
    sut = new InferenceExecutor(table, metrics);
    ready = new WorkerModel(versionName('multi-io', '1'), 'multi-io', '1');
    ready.ready(await new OrtModelRuntime({ intraOpThreads: 1 }).load(buildMultiIoModel().bytes, ['cpu']), 4);
    table.add(ready);
  });
  afterEach(async () => {
    for (const entry of table.list()) await entry.release();
  });

  it('answers with the model, the version that ran, the request id and the outputs', async () => {
    const response = await sut.infer(request('multi-io', '1', [x(2), ids(2)], ['y']));
    expect(response).toMatchObject({ modelName: 'multi-io', modelVersion: '1', id: 'req-7' });
    expect(response.outputs.map((o) => o.name)).toEqual(['y']);
    expect(Array.from(new Float32Array(Uint8Array.from(response.outputs[0]!.data).buffer))).toEqual(new Array(8).fill(3));
  });

  it('answers NOT_FOUND (MODEL_NOT_FOUND) for a model or version this worker does not hold', async () => {
    const model = await rpcRejection(sut.infer(request('resnet', '1', [x(1), ids(1)])));
    expect([model.code, model.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
    const version = await rpcRejection(sut.infer(request('multi-io', '2', [x(1), ids(1)])));
    expect([version.code, version.reason]).toEqual([status.NOT_FOUND, 'MODEL_NOT_FOUND']);
    expect(version.message).toMatch(/version 2/);
  });

  it('answers UNAVAILABLE (MODEL_NOT_READY) for a version still loading or failed, with the reason', async () => {
    table.add(new WorkerModel(versionName('multi-io', '2'), 'multi-io', '2'));
    const loading = await rpcRejection(sut.infer(request('multi-io', '2', [x(1), ids(1)])));
    expect([loading.code, loading.reason]).toEqual([status.UNAVAILABLE, 'MODEL_NOT_READY']);
    const failed = new WorkerModel(versionName('multi-io', '3'), 'multi-io', '3');
    failed.fail('artifact refused');
    table.add(failed);
    const error = await rpcRejection(sut.infer(request('multi-io', '3', [x(1), ids(1)])));
    expect(error.code).toBe(status.UNAVAILABLE);
    expect(error.message).toMatch(/artifact refused/);
  });

  it('answers INVALID_ARGUMENT (INVALID_TENSOR) naming the tensor for inputs that do not fit the model', async () => {
    const missing = await rpcRejection(sut.infer(request('multi-io', '1', [x(1)])));
    expect([missing.code, missing.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
    expect(missing.message).toMatch(/"ids"/);
    const wrongShape = create(TensorSchema, { ...x(1), shape: [1n, 5n], data: Buffer.alloc(20) });
    expect((await rpcRejection(sut.infer(request('multi-io', '1', [wrongShape, ids(1)])))).message).toMatch(/"x".*shape/);
    const tooBig = await rpcRejection(sut.infer(request('multi-io', '1', [x(5), ids(5)])));
    expect(tooBig.message).toMatch(/batch size 5/);
    const unknownOutput = await rpcRejection(sut.infer(request('multi-io', '1', [x(1), ids(1)], ['logits'])));
    expect(unknownOutput.code).toBe(status.INVALID_ARGUMENT);
  });

  it('drops a request whose deadline has passed instead of running it', async () => {
    const error = await rpcRejection(sut.infer(request('multi-io', '1', [x(1), ids(1)]), Date.now() - 1));
    expect(error.code).toBe(status.DEADLINE_EXCEEDED);
  });

  it('releases a session only after the requests running on it finish', async () => {
    const running = sut.infer(request('multi-io', '1', [x(2), ids(2)]));
    table.remove(ready.name);
    const released = ready.release();
    await expect(running).resolves.toMatchObject({ modelVersion: '1' });
    await released;
    expect(ready.session).toBeUndefined();
    expect(ready.state).toBe(ModelState.READY);
  });
});
