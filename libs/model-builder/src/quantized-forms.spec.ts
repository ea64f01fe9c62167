import * as ort from 'onnxruntime-node';
import { onnx } from 'onnx-proto';
import { createHash } from 'node:crypto';
import { ONNX_ELEM_TYPE } from './onnx-graph';
import { SeededRandom } from './prng';
import {
  buildQuantizedFormModel,
  QUANTIZED_FORMS,
  type QuantizedForm,
  quantizedFormReference,
} from './quantized-forms';

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

async function open(bytes: Uint8Array): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
}

/** ||actual - expected|| / ||expected||. */
function relativeL2(actual: Float32Array, expected: Float32Array): number {
  let error = 0;
  let norm = 0;
  expected.forEach((e, i) => {
    error += (actual[i]! - e) ** 2;
    norm += e * e;
  });
  return Math.sqrt(error / norm);
}

/** The operators each form is named for, besides the float ones around them. */
const FORM_OPS: Readonly<Record<QuantizedForm, readonly string[]>> = {
  qdq: ['QuantizeLinear', 'DequantizeLinear', 'MatMul'],
  'matmul-integer': ['DynamicQuantizeLinear', 'MatMulInteger', 'Cast'],
  'qlinear-matmul': ['QuantizeLinear', 'QLinearMatMul', 'DequantizeLinear'],
  'qlinear-conv': ['QuantizeLinear', 'QLinearConv', 'DequantizeLinear'],
  'conv-integer': ['DynamicQuantizeLinear', 'ConvInteger', 'Cast'],
  'dynamic-quantize-linear': ['DynamicQuantizeLinear', 'DequantizeLinear'],
};

/** Within this relative L2 of the float computation they stand for, on inputs uniform in [-1, 1]: they come within 0.004 to 0.014. */
const TOLERANCE = 0.03;

describe(buildQuantizedFormModel.name, () => {
  it('builds every form', () => {
    expect([...QUANTIZED_FORMS].sort()).toEqual(Object.keys(FORM_OPS).sort());
  });

  describe.each(QUANTIZED_FORMS)('%s', (form) => {
    it('declares one FP32 input and one FP32 output with a dynamic batch dimension, as the session sees them', async () => {
      const sut = buildQuantizedFormModel(form);
      expect(sut.name).toBe(`quantized-${form}`);
      expect(sut.inputs).toEqual([{ name: 'input', datatype: 'FP32', shape: [-1, ...sut.inputs[0]!.shape.slice(1)] }]);
      expect(sut.outputs).toEqual([
        { name: 'output', datatype: 'FP32', shape: [-1, ...sut.outputs[0]!.shape.slice(1)] },
      ]);
      expect(sut.inputs[0]!.shape.slice(1).every((d) => d > 0)).toBe(true);
      const session = await open(sut.bytes);
      expect(session.inputNames).toEqual(['input']);
      expect(session.outputNames).toEqual(['output']);
      expect(session.inputMetadata[0]).toMatchObject({
        isTensor: true,
        type: 'float32',
        shape: ['batch', ...sut.inputs[0]!.shape.slice(1)],
      });
      expect(session.outputMetadata[0]).toMatchObject({
        isTensor: true,
        type: 'float32',
        shape: ['batch', ...sut.outputs[0]!.shape.slice(1)],
      });
      await session.release();
    });

    it.each([1, 4])(`runs a batch of %i within ${TOLERANCE} relative L2 of its float reference`, async (batch) => {
      const sut = buildQuantizedFormModel(form);
      const session = await open(sut.bytes);
      const inputShape = [batch, ...sut.inputs[0]!.shape.slice(1)];
      const x = new SeededRandom(100 + batch).uniformFloat32(
        inputShape.reduce((a, b) => a * b),
        -1,
        1,
      );
      const { output } = await session.run({ input: new ort.Tensor('float32', x, inputShape) });
      expect(output!.type).toBe('float32');
      expect(output!.dims).toEqual([batch, ...sut.outputs[0]!.shape.slice(1)]);
      const actual = output!.data as Float32Array;
      const expected = quantizedFormReference(form).forward(x, batch);
      expect(actual).toHaveLength(expected.length);
      expect(relativeL2(actual, expected)).toBeLessThan(TOLERANCE);
      // Quantized, not float: the output is not the float one to rounding error.
      expect(relativeL2(actual, expected)).toBeGreaterThan(1e-5);
      await session.release();
    });

    it('is made of the operators the form is named for, in opset 17 default domain only', () => {
      const model = onnx.ModelProto.decode(buildQuantizedFormModel(form).bytes);
      expect(model.opsetImport.map((o) => [o.domain ?? '', Number(o.version)])).toEqual([['', 17]]);
      const nodes = model.graph?.node ?? [];
      expect(nodes.map((n) => n.opType)).toEqual(expect.arrayContaining([...FORM_OPS[form]]));
      expect(nodes.every((n) => (n.domain ?? '') === '')).toBe(true);
    });

    it('stores its weights quantized and builds byte-identical models every time', () => {
      const sut = buildQuantizedFormModel(form);
      expect(sha256(sut.bytes)).toBe(sha256(buildQuantizedFormModel(form).bytes));
      const { weight } = quantizedFormReference(form);
      const initializers = onnx.ModelProto.decode(sut.bytes).graph?.initializer ?? [];
      // No float tensor bigger than a bias or a scale: the weights are there only quantized.
      const floatElements = initializers
        .filter((t) => t.dataType === ONNX_ELEM_TYPE.FP32)
        .map((t) => (t.dims ?? []).map(Number).reduce((a, b) => a * b, 1));
      expect(Math.max(0, ...floatElements)).toBeLessThan(64);
      if (weight !== undefined) {
        const quantized = initializers.find((t) => t.name === 'weight.quantized');
        expect([ONNX_ELEM_TYPE.INT8, ONNX_ELEM_TYPE.UINT8]).toContain(quantized?.dataType);
        expect(quantized!.rawData!.length).toBe(weight.length);
      }
    });
  });

  it('quantizes the dynamic forms over the whole batch, so a row depends slightly on its batch-mates', async () => {
    const session = await open(buildQuantizedFormModel('dynamic-quantize-linear').bytes);
    const row = new SeededRandom(5).uniformFloat32(64, -0.5, 0.5);
    const alone = (await session.run({ input: new ort.Tensor('float32', row, [1, 64]) }))['output']!
      .data as Float32Array;
    const batched = Float32Array.of(...row, ...new Float32Array(64).fill(4));
    const together = (await session.run({ input: new ort.Tensor('float32', batched, [2, 64]) }))['output']!
      .data as Float32Array;
    expect(relativeL2(alone, row)).toBeLessThan(0.01);
    expect(Array.from(together.subarray(0, 64))).not.toEqual(Array.from(alone));
    expect(relativeL2(together.subarray(0, 64), row)).toBeLessThan(TOLERANCE);
    await session.release();
  });
});
