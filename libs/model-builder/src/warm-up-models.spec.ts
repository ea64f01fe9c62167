import * as ort from 'onnxruntime-node';
import { buildReflectPadModel, buildSampleRateModel } from './warm-up-models';

async function open(bytes: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
}

const audio = (values: number[], rows = 1) =>
  new ort.Tensor('float32', Float32Array.from(values), [rows, values.length / rows]);

describe(buildReflectPadModel.name, () => {
  it('pads each row by one sample in reflect mode and sums the squares', async () => {
    const sut = await open(buildReflectPadModel().bytes);
    const { padded, energy } = await sut.run({ audio: audio([1, 2, 3, 4, 5, 6], 2) });
    expect(padded!.dims).toEqual([2, 5]);
    expect(Array.from(padded!.data as Float32Array)).toEqual([2, 1, 2, 3, 2, 5, 4, 5, 6, 5]);
    expect(Array.from(energy!.data as Float32Array)).toEqual([4 + 1 + 4 + 9 + 4, 25 + 16 + 25 + 36 + 25]);
    await sut.release();
  });

  it('fails at run time on fewer than 2 samples, as a synthetic warm-up gives it', async () => {
    const sut = await open(buildReflectPadModel().bytes);
    await expect(sut.run({ audio: audio([0]) })).rejects.toThrow(/Pad reflect requires axis length >= 2/);
    await sut.release();
  });

  it('declares a batch and a samples dimension, both dynamic', () => {
    expect(buildReflectPadModel().inputs).toEqual([
      expect.objectContaining({ name: 'audio', datatype: 'FP32', shape: [-1, -1] }),
    ]);
  });
});

describe(buildSampleRateModel.name, () => {
  const sr = (rate: number) => new ort.Tensor('int64', BigInt64Array.of(BigInt(rate)), [1]);

  it.each([
    [8000, [0.5, -1, 1.5]],
    [16000, [1, -2, 3]],
  ])('scales the audio by sr / 16000 at %i Hz', async (rate, expected) => {
    const sut = await open(buildSampleRateModel().bytes);
    const { scaled } = await sut.run({ audio: audio([1, -2, 3]), sr: sr(rate) });
    expect(scaled!.dims).toEqual([1, 3]);
    expect(Array.from(scaled!.data as Float32Array)).toEqual(expected);
    await sut.release();
  });

  it.each([0, 44100])('fails at run time for the unsupported rate %i', async (rate) => {
    const sut = await open(buildSampleRateModel().bytes);
    await expect(sut.run({ audio: audio([1, 2, 3]), sr: sr(rate) })).rejects.toThrow(
      /indices element out of data bounds/,
    );
    await sut.release();
  });
});
