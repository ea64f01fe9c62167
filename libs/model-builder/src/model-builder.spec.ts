import * as ort from 'onnxruntime-node';
import { createHash } from 'node:crypto';
import { DEMO_MODELS } from './demo-models';
import { buildMlpModel, mlpLayers } from './mlp-model';
import { buildIdentityModel } from './identity-model';
import { buildMultiIoModel } from './multi-io-model';
import {
  buildClassifierModel,
  CLASSIFIER_BIAS,
  CLASSIFIER_LABELS,
  CLASSIFIER_MEAN,
  CLASSIFIER_STD,
  CLASSIFIER_WEIGHT,
} from './classifier-model';
import { buildTinyModel, TINY_BIAS, TINY_WEIGHT } from './tiny-model';
import { SeededRandom } from './prng';

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

async function open(bytes: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
}

/** y = x · W + b for a row-major x [rows, in] and W [in, out]. */
function dense(
  x: Float32Array,
  rows: number,
  w: ArrayLike<number>,
  b: ArrayLike<number>,
  inF: number,
  outF: number,
  relu: boolean,
) {
  const y = new Float32Array(rows * outF);
  for (let r = 0; r < rows; r += 1) {
    for (let o = 0; o < outF; o += 1) {
      let sum = b[o]!;
      for (let i = 0; i < inF; i += 1) sum += x[r * inF + i]! * w[i * outF + o]!;
      y[r * outF + o] = relu ? Math.max(0, sum) : sum;
    }
  }
  return y;
}

describe(buildTinyModel.name, () => {
  it('computes input · W + b for a batch of rows', async () => {
    const sut = buildTinyModel();
    const session = await open(sut.bytes);
    expect(session.inputNames).toEqual(['input']);
    expect(session.outputNames).toEqual(['output']);
    const x = Float32Array.of(1, 2, 3, 4, -1, 0.5, 0, 2);
    const { output } = await session.run({ input: new ort.Tensor('float32', x, [2, 4]) });
    expect(output!.dims).toEqual([2, 3]);
    // Row 0 by hand: [1 + 0 - 3 + 2, 0 + 2 + 6 - 4, 0.5 - 1 + 0.75 + 4] + b
    expect(Array.from(output!.data as Float32Array).slice(0, 3)).toEqual(
      [0, 4, 4.25].map((v, i) => Math.fround(v + TINY_BIAS[i]!)),
    );
    const expected = dense(x, 2, TINY_WEIGHT, TINY_BIAS, 4, 3, false);
    Array.from(output!.data as Float32Array).forEach((v, i) => expect(v).toBeCloseTo(expected[i]!, 5));
    await session.release();
  });

  it('declares its signature with a dynamic batch dimension', () => {
    const sut = buildTinyModel();
    expect(sut.inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, 4] }]);
    expect(sut.outputs).toEqual([{ name: 'output', datatype: 'FP32', shape: [-1, 3] }]);
  });
});

describe(buildMultiIoModel.name, () => {
  it('returns every output with its own datatype', async () => {
    const sut = buildMultiIoModel();
    const session = await open(sut.bytes);
    expect([...session.inputNames].sort()).toEqual(['ids', 'x']);
    expect([...session.outputNames].sort()).toEqual(['ids_plus_one', 'positive', 'y']);
    const out = await session.run({
      x: new ort.Tensor('float32', Float32Array.of(1, -2, 0, 3.5, -0.5, 4, 5, -6), [2, 4]),
      ids: new ort.Tensor('int64', BigInt64Array.of(0n, 41n, -1n, 9_007_199_254_740_993n), [2, 2]),
    });
    expect(out['y']!.type).toBe('float32');
    expect(Array.from(out['y']!.data as Float32Array)).toEqual([2, -4, 0, 7, -1, 8, 10, -12]);
    expect(out['ids_plus_one']!.type).toBe('int64');
    expect(Array.from(out['ids_plus_one']!.data as BigInt64Array)).toEqual([1n, 42n, 0n, 9_007_199_254_740_994n]);
    expect(out['positive']!.type).toBe('bool');
    expect(Array.from(out['positive']!.data as Uint8Array)).toEqual([1, 0, 0, 1, 0, 1, 1, 0]);
    expect(out['positive']!.dims).toEqual([2, 4]);
    await session.release();
  });
});

describe(buildMlpModel.name, () => {
  it('matches a plain JavaScript forward pass of the same weights', async () => {
    const sizes = [16, 32, 24, 8];
    const sut = buildMlpModel({ sizes, seed: 7 });
    const session = await open(sut.bytes);
    expect(session.inputNames).toEqual(['input']);
    expect(session.outputNames).toEqual(['output']);
    const rows = 3;
    const x = new SeededRandom(99).uniformFloat32(rows * sizes[0]!, -1, 1);
    const { output } = await session.run({ input: new ort.Tensor('float32', x, [rows, sizes[0]!]) });
    expect(output!.dims).toEqual([rows, 8]);
    let expected = x;
    for (const layer of mlpLayers({ sizes, seed: 7 })) {
      expected = dense(expected, rows, layer.weight, layer.bias, layer.inFeatures, layer.outFeatures, layer.relu);
    }
    const actual = output!.data as Float32Array;
    for (let i = 0; i < expected.length; i += 1) expect(Math.abs(actual[i]! - expected[i]!)).toBeLessThan(1e-4);
    expect(actual.some((v) => v !== 0)).toBe(true);
    await session.release();
  });

  it('gives a different model for a different seed', () => {
    const sizes = [4, 4];
    expect(sha256(buildMlpModel({ sizes, seed: 1 }).bytes)).not.toBe(sha256(buildMlpModel({ sizes, seed: 2 }).bytes));
  });

  it('rejects layer sizes that make no model', () => {
    expect(() => buildMlpModel({ sizes: [8] })).toThrow(RangeError);
    expect(() => buildMlpModel({ sizes: [8, 0] })).toThrow(RangeError);
  });

  it('builds the default 512-2048-2048-512 model of about 25 MB with finite outputs', async () => {
    const sut = buildMlpModel();
    expect(sut.bytes.byteLength).toBeGreaterThan(25_000_000);
    expect(sut.bytes.byteLength).toBeLessThan(26_000_000);
    expect(sut.inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, 512] }]);
    const session = await open(sut.bytes);
    const { output } = await session.run({
      input: new ort.Tensor('float32', new SeededRandom(1).uniformFloat32(2 * 512, -1, 1), [2, 512]),
    });
    expect(output!.dims).toEqual([2, 512]);
    expect((output!.data as Float32Array).every((v) => Number.isFinite(v))).toBe(true);
    await session.release();
  });
});

describe(buildIdentityModel.name, () => {
  it('declares one input and one output per datatype, leaving out BF16 by default', async () => {
    const sut = buildIdentityModel();
    const session = await open(sut.bytes);
    expect([...session.inputNames].sort()).toEqual(
      [
        'bool',
        'bytes',
        'fp16',
        'fp32',
        'fp64',
        'int16',
        'int32',
        'int64',
        'int8',
        'uint16',
        'uint32',
        'uint64',
        'uint8',
      ].map((t) => `${t}_in`),
    );
    expect(session.outputNames).toHaveLength(13);
    expect(session.inputMetadata.find((m) => m.name === 'fp16_in')).toMatchObject({ type: 'float16' });
    expect(session.inputMetadata.find((m) => m.name === 'bytes_in')).toMatchObject({ type: 'string' });
    await session.release();
  });
});

describe(buildClassifierModel.name, () => {
  it('scores five classes as input · W + b, with class 4 mixing the features', async () => {
    const sut = buildClassifierModel();
    const session = await open(sut.bytes);
    const x = Float32Array.of(1, 2, 3, 4, 0.5, -1, 2, 0);
    const { scores } = await session.run({ input: new ort.Tensor('float32', x, [2, 4]) });
    expect(scores!.dims).toEqual([2, 5]);
    // Row 0 by hand: the features, then (1 + 2 - 3 - 4) / 2 + 0.25.
    expect(Array.from(scores!.data as Float32Array)).toEqual([1, 2, 3, 4, -1.75, 0.5, -1, 2, 0, -1.0]);
    expect(Array.from(dense(x, 2, CLASSIFIER_WEIGHT, CLASSIFIER_BIAS, 4, 5, false))).toEqual(
      Array.from(scores!.data as Float32Array),
    );
    await session.release();
  });

  it('comes with a label per class and a per-feature normalization of its input', () => {
    const sut = buildClassifierModel();
    expect(sut.outputs).toEqual([{ name: 'scores', datatype: 'FP32', shape: [-1, 5] }]);
    expect(sut.processing).toEqual({
      inputNormalizations: [{ input: 'input', mean: [...CLASSIFIER_MEAN], std: [...CLASSIFIER_STD] }],
      outputLabels: [{ output: 'scores', labels: [...CLASSIFIER_LABELS] }],
    });
    expect(CLASSIFIER_LABELS).toHaveLength(5);
    // Plain data that survives JSON, as a launcher or a config file would pass it on.
    expect(JSON.parse(JSON.stringify(sut.processing))).toEqual(sut.processing);
  });
});

describe('DEMO_MODELS', () => {
  it.each(Object.keys(DEMO_MODELS))('%s builds byte-identical models every time', (name) => {
    const first = DEMO_MODELS[name]!();
    const second = DEMO_MODELS[name]!();
    expect(first.name).toBe(name);
    expect(sha256(first.bytes)).toBe(sha256(second.bytes));
  });

  it('registers mlp, tiny, multi-io, identity and classifier', () => {
    expect(Object.keys(DEMO_MODELS).sort()).toEqual(['classifier', 'identity', 'mlp', 'multi-io', 'tiny']);
  });
});
