import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { buildReflectPadModel } from '@infermesh/model-builder';
import { DataType, type TensorSpec, TensorSpecSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { WarmUpSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { decodeBytesElements, encodeBytesElements } from './bytes-elements';
import { rawToJson } from './json-data';
import * as ort from 'onnxruntime-node';
import { MAX_WARM_UP_RUN_ELEMENTS, warmUpBatchSizes, warmUpPlan } from './warm-up-inputs';

const spec = (name: string, datatype: DataType, shape: bigint[]): TensorSpec =>
  create(TensorSpecSchema, { name, datatype, shape });
const warmUp = (init: MessageInitShape<typeof WarmUpSchema>) => create(WarmUpSchema, init);

describe(warmUpPlan.name, () => {
  const specs = [spec('x', DataType.FP32, [-1n, 2n]), spec('text', DataType.BYTES, [-1n, 1n])];

  it('without samples: synthetic zeros at each batch size, every other dynamic dimension 1', () => {
    const sut = warmUpPlan(undefined, [spec('audio', DataType.FP32, [-1n, -1n])], 8, [1, 'max']);
    expect(sut.given).toBe(false);
    expect(sut.runs.map((r) => r.label)).toEqual(['synthetic warm-up at batch 1', 'synthetic warm-up at batch 8']);
    expect(sut.runs[1]!.inputs()[0]).toMatchObject({ shape: [8n, 1n], data: new Uint8Array(32) });
  });

  it('with samples: each as given, then repeated item by item to the warm-up batch sizes it does not have', () => {
    const sut = warmUpPlan(
      warmUp({
        samples: [
          {
            name: 'two rows',
            inputs: [
              {
                name: 'x',
                shape: [2n, 2n],
                contents: { case: 'data', value: new Uint8Array(Float32Array.of(1, 2, 3, 4).buffer) },
              },
              {
                name: 'text',
                shape: [2n, 1n],
                contents: { case: 'data', value: encodeBytesElements([Buffer.from('a'), Buffer.from('b')]) },
              },
            ],
          },
        ],
      }),
      specs,
      5,
      [1, 2, 'max'],
    );
    expect(sut.given).toBe(true);
    expect(sut.runs.map((r) => r.label)).toEqual([
      'warm-up sample "two rows"',
      'warm-up sample "two rows" at batch 1',
      'warm-up sample "two rows" at batch 5',
    ]);
    const [x, text] = sut.runs[2]!.inputs();
    expect([x!.datatype, x!.shape, rawToJson(DataType.FP32, x!.data)]).toEqual([
      DataType.FP32,
      [5n, 2n],
      [1, 2, 3, 4, 1, 2, 3, 4, 1, 2],
    ]);
    expect([text!.shape, decodeBytesElements(text!.data)!.map(String)]).toEqual([
      [5n, 1n],
      ['a', 'b', 'a', 'b', 'a'],
    ]);
    expect(rawToJson(DataType.FP32, sut.runs[1]!.inputs()[0]!.data)).toEqual([1, 2]);
  });

  it('does not repeat a sample to a batch size at which a tensor would pass MAX_WARM_UP_RUN_ELEMENTS', () => {
    const items = MAX_WARM_UP_RUN_ELEMENTS / 4;
    const sut = warmUpPlan(
      warmUp({
        samples: [
          { inputs: [{ name: 'audio', shape: [1n, BigInt(items)], contents: { case: 'zeroData', value: true } }] },
        ],
      }),
      [spec('audio', DataType.FP32, [-1n, -1n])],
      64,
      [1, 2, 4, 8, 'max'],
    );
    expect(sut.runs.map((r) => r.label)).toEqual([
      'warm-up sample 1',
      'warm-up sample 1 at batch 2',
      'warm-up sample 1 at batch 4',
    ]);
  });

  it('generates zeros and the same random values on every run, in range for the datatype', () => {
    const sut = warmUpPlan(
      warmUp({
        samples: [
          {
            inputs: [
              { name: 'x', shape: [1n, 2n], contents: { case: 'randomData', value: true } },
              { name: 'text', shape: [1n, 1n], contents: { case: 'zeroData', value: true } },
            ],
          },
          {
            inputs: [
              { name: 'n', datatype: DataType.INT8, shape: [64n], contents: { case: 'randomData', value: true } },
            ],
          },
        ],
      }),
      [...specs, spec('n', DataType.INT8, [64n])],
      0,
      [1, 'max'],
    );
    expect(sut.runs.map((r) => r.label)).toEqual(['warm-up sample 1', 'warm-up sample 2']);
    const [x, text] = sut.runs[0]!.inputs();
    const values = rawToJson(DataType.FP32, x!.data) as number[];
    expect(values.every((v) => v >= 0 && v < 1)).toBe(true);
    expect(new Set(values).size).toBe(2);
    expect(sut.runs[0]!.inputs()[0]!.data).toEqual(x!.data);
    expect(decodeBytesElements(text!.data)!.map(String)).toEqual(['']);
    const ints = rawToJson(DataType.INT8, sut.runs[1]!.inputs()[0]!.data) as number[];
    expect(ints.every((v) => Number.isInteger(v) && v >= 0 && v <= 127)).toBe(true);
  });

  it('gives a model that needs a minimum length what it needs, where synthetic inputs fail it', async () => {
    const session = await ort.InferenceSession.create(buildReflectPadModel().bytes, {
      executionProviders: ['cpu'],
      intraOpNumThreads: 1,
    });
    const audio = [spec('audio', DataType.FP32, [-1n, -1n])];
    const run = (inputs: ReturnType<ReturnType<typeof warmUpPlan>['runs'][number]['inputs']>) =>
      session.run(
        Object.fromEntries(
          inputs.map((t) => [
            t.name,
            new ort.Tensor('float32', new Float32Array(Uint8Array.from(t.data).buffer), t.shape.map(Number)),
          ]),
        ),
      );
    const given = warmUpPlan(
      warmUp({
        samples: [{ inputs: [{ name: 'audio', shape: [1n, 512n], contents: { case: 'randomData', value: true } }] }],
      }),
      audio,
      4,
      [1, 'max'],
    );
    for (const r of given.runs) await expect(run(r.inputs())).resolves.toBeDefined();
    await expect(run(warmUpPlan(undefined, audio, 4, [1, 'max']).runs[0]!.inputs())).rejects.toThrow(
      /Pad reflect requires axis length >= 2/,
    );
    await session.release();
  });
});

describe(warmUpBatchSizes.name, () => {
  it('resolves "max", caps at the max batch size, and gives 1 for a model that does not batch', () => {
    expect(warmUpBatchSizes([1, 'max', 100], 16)).toEqual([1, 16]);
    expect(warmUpBatchSizes([4, 'max'], 0)).toEqual([1]);
  });
});
