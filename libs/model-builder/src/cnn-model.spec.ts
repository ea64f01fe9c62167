import * as ort from 'onnxruntime-node';
import { onnx } from 'onnx-proto';
import { createHash } from 'node:crypto';
import { buildCnnModel, CNN_INPUT_SHAPE, cnnLayers, type CnnOptions } from './cnn-model';
import { SeededRandom } from './prng';

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

async function open(bytes: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
}

/** A 3×3 convolution, stride 2, zero padding 1, plus bias, then Relu, of one image x [inC, h, w]. */
function convRelu(
  x: Float64Array,
  inC: number,
  h: number,
  w: number,
  weight: Float32Array,
  bias: Float32Array,
  outC: number,
) {
  const outH = Math.floor((h + 2 - 3) / 2) + 1;
  const outW = Math.floor((w + 2 - 3) / 2) + 1;
  const y = new Float64Array(outC * outH * outW);
  for (let o = 0; o < outC; o += 1) {
    for (let row = 0; row < outH; row += 1) {
      for (let col = 0; col < outW; col += 1) {
        let sum = bias[o]!;
        for (let c = 0; c < inC; c += 1) {
          for (let kr = 0; kr < 3; kr += 1) {
            const r = row * 2 + kr - 1;
            if (r < 0 || r >= h) continue;
            for (let kc = 0; kc < 3; kc += 1) {
              const q = col * 2 + kc - 1;
              if (q < 0 || q >= w) continue;
              sum += x[(c * h + r) * w + q]! * weight[((o * inC + c) * 3 + kr) * 3 + kc]!;
            }
          }
        }
        y[(o * outH + row) * outW + col] = Math.max(0, sum);
      }
    }
  }
  return { y, h: outH, w: outW };
}

/** The CNN's scores for one image [3, 48, 192], in plain JavaScript from cnnLayers' weights. */
function cnnScores(image: Float32Array, options: CnnOptions): Float64Array {
  const { convs, fc } = cnnLayers(options);
  let x = Float64Array.from(image);
  let [, h, w] = CNN_INPUT_SHAPE as [number, number, number];
  for (const conv of convs)
    ({ y: x, h, w } = convRelu(x, conv.inChannels, h, w, conv.weight, conv.bias, conv.outChannels));
  const pooled = Array.from(
    { length: fc.inFeatures },
    (_, c) => x.subarray(c * h * w, (c + 1) * h * w).reduce((a, b) => a + b, 0) / (h * w),
  );
  return Float64Array.from({ length: fc.outFeatures }, (_, o) =>
    pooled.reduce((sum, p, i) => sum + p * fc.weight[i * fc.outFeatures + o]!, fc.bias[o]!),
  );
}

const imageSize = CNN_INPUT_SHAPE.reduce((a, b) => a * b);

describe(buildCnnModel.name, () => {
  it('declares input [-1, 3, 48, 192] and scores [-1, classes], as the session sees them', async () => {
    const sut = buildCnnModel();
    expect(sut.name).toBe('cnn');
    expect(sut.inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, 3, 48, 192] }]);
    expect(sut.outputs).toEqual([{ name: 'scores', datatype: 'FP32', shape: [-1, 10] }]);
    const session = await open(sut.bytes);
    expect(session.inputMetadata).toEqual([
      expect.objectContaining({ name: 'input', type: 'float32', shape: ['batch', 3, 48, 192] }),
    ]);
    expect(session.outputMetadata).toEqual([
      expect.objectContaining({ name: 'scores', type: 'float32', shape: ['batch', 10] }),
    ]);
    await session.release();
  });

  it.each([
    [{}, 1],
    [{}, 3],
    [{ channels: [4, 6], classes: 5, seed: 3 }, 2],
  ] as [CnnOptions, number][])(
    'matches a plain JavaScript forward pass of the same weights (%j, batch %i)',
    async (options, batch) => {
      const session = await open(buildCnnModel(options).bytes);
      const x = new SeededRandom(10 + batch).uniformFloat32(batch * imageSize, -1, 1);
      const { scores } = await session.run({ input: new ort.Tensor('float32', x, [batch, ...CNN_INPUT_SHAPE]) });
      const classes = options.classes ?? 10;
      expect(scores!.dims).toEqual([batch, classes]);
      const actual = scores!.data as Float32Array;
      for (let n = 0; n < batch; n += 1) {
        const expected = cnnScores(x.subarray(n * imageSize, (n + 1) * imageSize), options);
        expected.forEach((e, o) => expect(Math.abs(actual[n * classes + o]! - e)).toBeLessThan(1e-5));
      }
      await session.release();
    },
  );

  it('scores different images differently, by far more than the tolerance above', async () => {
    const session = await open(buildCnnModel().bytes);
    const x = new SeededRandom(1).uniformFloat32(2 * imageSize, -1, 1);
    const { scores } = await session.run({ input: new ort.Tensor('float32', x, [2, ...CNN_INPUT_SHAPE]) });
    const data = scores!.data as Float32Array;
    const difference = Math.max(...Array.from({ length: 10 }, (_, o) => Math.abs(data[o]! - data[10 + o]!)));
    expect(difference).toBeGreaterThan(1e-3);
    await session.release();
  });

  it('is a Conv and Relu per channel count, then GlobalAveragePool, Flatten, MatMul and Add', () => {
    const graph = onnx.ModelProto.decode(buildCnnModel({ channels: [8, 16] }).bytes).graph;
    expect(graph?.node?.map((n) => n.opType)).toEqual([
      'Conv',
      'Relu',
      'Conv',
      'Relu',
      'GlobalAveragePool',
      'Flatten',
      'MatMul',
      'Add',
    ]);
    expect(graph?.initializer?.map((t) => [t.name, (t.dims ?? []).map(Number)])).toEqual([
      ['conv0.weight', [8, 3, 3, 3]],
      ['conv0.bias', [8]],
      ['conv1.weight', [16, 8, 3, 3]],
      ['conv1.bias', [16]],
      ['fc.weight', [16, 10]],
      ['fc.bias', [10]],
    ]);
  });

  it('builds byte-identical models for the same options and different ones for another seed', () => {
    expect(sha256(buildCnnModel().bytes)).toBe(sha256(buildCnnModel().bytes));
    expect(sha256(buildCnnModel({ seed: 1 }).bytes)).not.toBe(sha256(buildCnnModel().bytes));
    expect(buildCnnModel({ name: 'other' }).name).toBe('other');
  });

  it('rejects channels or classes that make no model', () => {
    expect(() => buildCnnModel({ channels: [] })).toThrow(RangeError);
    expect(() => buildCnnModel({ channels: [8, 0] })).toThrow(RangeError);
    expect(() => buildCnnModel({ classes: 0 })).toThrow(RangeError);
    expect(() => buildCnnModel({ classes: 2.5 })).toThrow(RangeError);
  });
});
