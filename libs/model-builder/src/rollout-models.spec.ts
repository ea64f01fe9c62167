import * as ort from 'onnxruntime-node';
import { buildInputRangeModel, buildSlowModel } from './rollout-models';
import { buildTinyModel } from './tiny-model';

async function open(bytes: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
}

const rows = (values: number[][]) => ({
  input: new ort.Tensor('float32', Float32Array.from(values.flat()), [values.length, 4]),
});

describe(buildInputRangeModel.name, () => {
  it('answers as the tiny model does while every first feature is in range', async () => {
    const [sut, tiny] = await Promise.all([open(buildInputRangeModel(8).bytes), open(buildTinyModel().bytes)]);
    const input = rows([
      [7.5, 1, 2, 3],
      [-8, 0.5, -1, 2],
    ]);
    const { output } = await sut.run(input);
    expect(Array.from(output!.data as Float32Array)).toEqual(
      Array.from((await tiny.run(input)).output!.data as Float32Array),
    );
    await Promise.all([sut.release(), tiny.release()]);
  });

  it('fails the whole batch at run time when one first feature is out of range', async () => {
    const sut = await open(buildInputRangeModel(8).bytes);
    await expect(
      sut.run(
        rows([
          [1, 1, 1, 1],
          [8, 1, 1, 1],
        ]),
      ),
    ).rejects.toThrow(/out of (data )?bounds/);
    await sut.release();
  });
});

describe(buildSlowModel.name, () => {
  it("has the tiny model's signature and answers every item", async () => {
    const built = buildSlowModel({ hidden: 64, layers: 4 });
    expect(built.inputs).toEqual(buildTinyModel().inputs);
    expect(built.outputs).toEqual(buildTinyModel().outputs);
    const sut = await open(built.bytes);
    const { output } = await sut.run(rows([[1, 2, 3, 4]]));
    expect(output!.dims).toEqual([1, 3]);
    expect(Array.from(output!.data as Float32Array).every(Number.isFinite)).toBe(true);
    await sut.release();
  });
});
