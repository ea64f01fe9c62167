import * as ort from 'onnxruntime-node';
import { onnx } from 'onnx-proto';
import {
  buildMlpModel,
  buildTinyModel,
  encodeModel,
  floatInitializer,
  node,
  SeededRandom,
} from '@infermesh/model-builder';
import { relativeL2 } from '@infermesh/testing';
import { floatValues, QuantizationError, quantizeDynamic } from './quantize-dynamic';

async function run(bytes: Uint8Array, input: Float32Array, dims: number[]): Promise<Float32Array> {
  const session = await ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const outputs = await session.run({ [session.inputNames[0]!]: new ort.Tensor('float32', input, dims) });
  await session.release();
  return outputs[session.outputNames[0]!]!.data as Float32Array;
}

/** The decoded graph: a class instance, whose repeated fields are arrays. */
const graphOf = (bytes: Uint8Array) => onnx.ModelProto.decode(bytes).graph as onnx.GraphProto;
const opTypes = (bytes: Uint8Array) => graphOf(bytes).node.map((n) => n.opType);
const uniform = (count: number, seed = 7) => new SeededRandom(seed).uniformFloat32(count, -1, 1);

/** input [-1, inF] -> Gemm(input, W, C) with the given attributes -> output [-1, outF]. */
function gemmModel(inF: number, outF: number, attrs: { transB?: boolean; alpha?: number; beta?: number }) {
  const random = new SeededRandom(3);
  const weightDims = attrs.transB ? [outF, inF] : [inF, outF];
  const attribute: onnx.IAttributeProto[] = [
    { name: 'transB', type: onnx.AttributeProto.AttributeType.INT, i: attrs.transB ? 1 : 0 },
    { name: 'alpha', type: onnx.AttributeProto.AttributeType.FLOAT, f: attrs.alpha ?? 1 },
    { name: 'beta', type: onnx.AttributeProto.AttributeType.FLOAT, f: attrs.beta ?? 1 },
  ];
  return encodeModel('gemm', {
    nodes: [node('Gemm', ['input', 'weight', 'bias'], ['output'], 'gemm', attribute)],
    initializers: [
      floatInitializer('weight', weightDims, random.uniformFloat32(inF * outF, -0.2, 0.2)),
      floatInitializer('bias', [outF], random.uniformFloat32(outF, -1, 1)),
    ],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, inF] }],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, outF] }],
  });
}

/** input [-1, channels, 12, 12] -> Conv 3×3 (pads 1) with bias -> Relu -> Conv 3×3 -> output. */
function convModel(channels: number, filters: number) {
  const random = new SeededRandom(5);
  const ints = (name: string, values: number[]): onnx.IAttributeProto => ({
    name,
    type: onnx.AttributeProto.AttributeType.INTS,
    ints: values,
  });
  const conv = (i: string, o: string, n: string, w: string, b: string) =>
    node('Conv', [i, w, b], [o], n, [ints('kernel_shape', [3, 3]), ints('pads', [1, 1, 1, 1])]);
  const b1 = 1 / Math.sqrt(channels * 9);
  const b2 = 1 / Math.sqrt(filters * 9);
  return encodeModel('conv', {
    nodes: [
      conv('input', 'c1', 'conv1', 'w1', 'b1'),
      node('Relu', ['c1'], ['r1'], 'relu1'),
      conv('r1', 'output', 'conv2', 'w2', 'b2'),
    ],
    initializers: [
      floatInitializer('w1', [filters, channels, 3, 3], random.uniformFloat32(filters * channels * 9, -b1, b1)),
      floatInitializer('b1', [filters], random.uniformFloat32(filters, -b1, b1)),
      floatInitializer('w2', [filters, filters, 3, 3], random.uniformFloat32(filters * filters * 9, -b2, b2)),
      floatInitializer('b2', [filters], random.uniformFloat32(filters, -b2, b2)),
    ],
    inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, channels, 12, 12] }],
    outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, filters, 12, 12] }],
  });
}

describe(quantizeDynamic.name, () => {
  const mlp = buildMlpModel({ sizes: [64, 128, 32] });

  it('turns every MatMul of the MLP into MatMulInteger on int8 weights, within 2 % relative L2 of the float model', async () => {
    const sut = quantizeDynamic(mlp.bytes);
    expect(sut.quantized.map((q) => [q.node, q.opType, q.weight, q.elements])).toEqual([
      ['fc0_matmul', 'MatMul', 'fc0.weight', 64 * 128],
      ['fc1_matmul', 'MatMul', 'fc1.weight', 128 * 32],
    ]);
    expect(sut.keptFloat).toEqual([]);
    const ops = opTypes(sut.bytes);
    expect(ops).not.toContain('MatMul');
    expect(ops.filter((op) => op === 'MatMulInteger')).toHaveLength(2);
    expect(ops.filter((op) => op === 'DynamicQuantizeLinear')).toHaveLength(2);
    // The float weights are gone: about a quarter of the bytes, plus biases and scales.
    expect(sut.weightBytesAfter / sut.weightBytesBefore).toBeLessThan(0.3);
    const graph = graphOf(sut.bytes);
    expect(graph.initializer.map((t) => t.name)).not.toContain('fc0.weight');
    const input = uniform(8 * 64);
    const [reference, quantized] = await Promise.all([run(mlp.bytes, input, [8, 64]), run(sut.bytes, input, [8, 64])]);
    expect(quantized).toHaveLength(8 * 32);
    expect(relativeL2(reference, quantized)).toBeLessThan(0.02);
    expect(relativeL2(reference, quantized)).toBeGreaterThan(0);
  });

  it('keeps the inputs and outputs, with their names, types and shapes', () => {
    const before = graphOf(mlp.bytes);
    const after = graphOf(quantizeDynamic(mlp.bytes).bytes);
    expect(onnx.GraphProto.toObject(after, { longs: Number }).input).toEqual(
      onnx.GraphProto.toObject(before, { longs: Number }).input,
    );
    expect(after.output).toEqual(before.output);
  });

  it('is deterministic: the same model gives the same bytes', () => {
    expect(Buffer.from(quantizeDynamic(mlp.bytes).bytes).equals(Buffer.from(quantizeDynamic(mlp.bytes).bytes))).toBe(
      true,
    );
  });

  it('is closer per channel than per tensor when the columns of a weight have different ranges', async () => {
    const rows = 32;
    const columns = 16;
    const weight = uniform(rows * columns, 11).map((v, i) => v * (i % columns === 0 ? 20 : 0.05));
    const model = encodeModel('skewed', {
      nodes: [node('MatMul', ['input', 'weight'], ['output'], 'matmul')],
      initializers: [floatInitializer('weight', [rows, columns], weight)],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, rows] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, columns] }],
    });
    const input = uniform(4 * rows);
    const reference = await run(model.bytes, input, [4, rows]);
    // Errors of the small columns only: the large one dominates any overall norm.
    const smallColumns = (values: Float32Array) => values.filter((_, i) => i % columns !== 0);
    const perChannel = relativeL2(
      smallColumns(reference),
      smallColumns(await run(quantizeDynamic(model.bytes).bytes, input, [4, rows])),
    );
    const perTensor = relativeL2(
      smallColumns(reference),
      smallColumns(await run(quantizeDynamic(model.bytes, { perChannel: false }).bytes, input, [4, rows])),
    );
    expect(perChannel).toBeLessThan(0.02);
    expect(perTensor).toBeGreaterThan(5 * perChannel);
  });

  it.each([
    ['plain', {}],
    ['transB, alpha 0.5 and beta 2', { transB: true, alpha: 0.5, beta: 2 }],
  ])('quantizes a Gemm (%s) to the same values as the float one, within 2 %%', async (_, attrs) => {
    const model = gemmModel(48, 24, attrs);
    const sut = quantizeDynamic(model.bytes);
    expect(sut.quantized.map((q) => q.opType)).toEqual(['Gemm']);
    expect(opTypes(sut.bytes)).not.toContain('Gemm');
    const input = uniform(5 * 48);
    expect(relativeL2(await run(model.bytes, input, [5, 48]), await run(sut.bytes, input, [5, 48]))).toBeLessThan(0.02);
  });

  it('keeps a Gemm that transposes its input in float, and says why', () => {
    const model = gemmModel(8, 4, {});
    const decoded = onnx.ModelProto.decode(model.bytes);
    ((decoded.graph as onnx.GraphProto).node[0] as onnx.NodeProto).attribute.push(
      onnx.AttributeProto.create({ name: 'transA', type: onnx.AttributeProto.AttributeType.INT, i: 1 }),
    );
    expect(() => quantizeDynamic(onnx.ModelProto.encode(decoded).finish())).toThrow(
      /nothing to quantize.*Gemm "gemm": it transposes its first input \(transA\)/,
    );
  });

  it('keeps Convs in float unless asked, saying why, and quantizes them to ConvInteger when asked', async () => {
    const model = convModel(3, 32);
    expect(() => quantizeDynamic(model.bytes)).toThrow(
      /nothing to quantize.*Conv "conv1": Conv is not among the operators asked for \(MatMul, Gemm\)/,
    );
    const sut = quantizeDynamic(model.bytes, { ops: ['Conv'] });
    expect(sut.quantized.map((q) => [q.node, q.opType, q.elements])).toEqual([
      ['conv1', 'Conv', 32 * 3 * 9],
      ['conv2', 'Conv', 32 * 32 * 9],
    ]);
    expect(opTypes(sut.bytes)).not.toContain('Conv');
    expect(opTypes(sut.bytes).filter((op) => op === 'ConvInteger')).toHaveLength(2);
    const input = uniform(2 * 3 * 144);
    expect(
      relativeL2(await run(model.bytes, input, [2, 3, 12, 12]), await run(sut.bytes, input, [2, 3, 12, 12])),
    ).toBeLessThan(0.02);
  });

  it('quantizes an activation once for every node that reads it', () => {
    const random = new SeededRandom(9);
    const model = encodeModel('fork', {
      nodes: [
        node('MatMul', ['input', 'a'], ['left'], 'left'),
        node('MatMul', ['input', 'b'], ['right'], 'right'),
        node('Add', ['left', 'right'], ['output'], 'add'),
      ],
      initializers: [
        floatInitializer('a', [8, 4], random.uniformFloat32(32, -1, 1)),
        floatInitializer('b', [8, 4], random.uniformFloat32(32, -1, 1)),
      ],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 8] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 4] }],
    });
    expect(opTypes(quantizeDynamic(model.bytes).bytes).filter((op) => op === 'DynamicQuantizeLinear')).toHaveLength(1);
  });

  it('stores a weight that several nodes read once: tied weights stay tied', async () => {
    const random = new SeededRandom(4);
    const model = encodeModel('tied', {
      nodes: [
        node('MatMul', ['input', 'shared'], ['h'], 'first'),
        node('Relu', ['h'], ['r'], 'relu'),
        node('MatMul', ['r', 'shared'], ['output'], 'second'),
      ],
      initializers: [floatInitializer('shared', [8, 8], random.uniformFloat32(64, -1, 1))],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 8] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 8] }],
    });
    const sut = quantizeDynamic(model.bytes);
    expect(sut.quantized.map((q) => q.node)).toEqual(['first', 'second']);
    expect(
      graphOf(sut.bytes)
        .initializer.map((t) => t.name)
        .sort(),
    ).toEqual(['shared_quantized', 'shared_scale', 'shared_zero_point']);
    const input = uniform(3 * 8);
    expect(relativeL2(await run(model.bytes, input, [3, 8]), await run(sut.bytes, input, [3, 8]))).toBeLessThan(0.03);
  });

  it("keeps in float a weight that is also a graph input (a caller may override it), and leaves the graph's inputs as they were", () => {
    const random = new SeededRandom(6);
    const model = encodeModel('overridable', {
      nodes: [node('MatMul', ['input', 'w'], ['h'], 'fixed'), node('MatMul', ['h', 'v'], ['output'], 'overridable')],
      initializers: [
        floatInitializer('w', [4, 4], random.uniformFloat32(16, -1, 1)),
        floatInitializer('v', [4, 2], random.uniformFloat32(8, -1, 1)),
      ],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 2] }],
    });
    const decoded = onnx.ModelProto.decode(model.bytes);
    (decoded.graph as onnx.GraphProto).input.push(
      onnx.ValueInfoProto.create({
        name: 'v',
        type: { tensorType: { elemType: 1, shape: { dim: [{ dimValue: 4 }, { dimValue: 2 }] } } },
      }),
    );

    const sut = quantizeDynamic(onnx.ModelProto.encode(decoded).finish());

    expect(sut.quantized.map((q) => q.node)).toEqual(['fixed']);
    expect(sut.keptFloat).toEqual([
      {
        node: 'overridable',
        opType: 'MatMul',
        reason: 'its weight "v" is also a graph input, which a caller may override',
      },
    ]);
    expect(graphOf(sut.bytes).input.map((v) => v.name)).toEqual(['input', 'v']);
  });

  it('leaves nodes of other domains alone', () => {
    const random = new SeededRandom(6);
    const model = encodeModel('domains', {
      nodes: [node('MatMul', ['input', 'w'], ['output'], 'standard')],
      initializers: [floatInitializer('w', [4, 4], random.uniformFloat32(16, -1, 1))],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 4] }],
    });
    const decoded = onnx.ModelProto.decode(model.bytes);
    ((decoded.graph as onnx.GraphProto).node[0] as onnx.NodeProto).domain = 'com.example';
    expect(() => quantizeDynamic(onnx.ModelProto.encode(decoded).finish())).toThrow(
      /^nothing to quantize: the model has no MatMul, Gemm node/,
    );
  });

  it('keeps a weight that a subgraph also reads, and the model still loads', async () => {
    const random = new SeededRandom(8);
    const branch = (name: string) =>
      onnx.GraphProto.create({
        name,
        node: [{ opType: 'Identity', input: ['w'], output: [`${name}_out`], name: `${name}_identity` }],
        output: [
          {
            name: `${name}_out`,
            type: { tensorType: { elemType: 1, shape: { dim: [{ dimValue: 4 }, { dimValue: 4 }] } } },
          },
        ],
      });
    const model = encodeModel('branches', {
      nodes: [
        node('MatMul', ['input', 'w'], ['output'], 'dense'),
        node('If', ['flag'], ['picked'], 'if', [
          { name: 'then_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('then') },
          { name: 'else_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('else') },
        ]),
      ],
      initializers: [floatInitializer('w', [4, 4], random.uniformFloat32(16, -1, 1))],
      inputs: [
        { name: 'input', datatype: 'FP32', shape: [-1, 4] },
        { name: 'flag', datatype: 'BOOL', shape: [] },
      ],
      outputs: [
        { name: 'output', datatype: 'FP32', shape: [-1, 4] },
        { name: 'picked', datatype: 'FP32', shape: [4, 4] },
      ],
    });

    const sut = quantizeDynamic(model.bytes);

    expect(sut.quantized.map((q) => q.node)).toEqual(['dense']);
    expect(graphOf(sut.bytes).initializer.map((t) => t.name)).toContain('w');
    const session = await ort.InferenceSession.create(sut.bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
    const out = await session.run({
      input: new ort.Tensor('float32', uniform(8), [2, 4]),
      flag: new ort.Tensor('bool', Uint8Array.of(1), []),
    });
    await session.release();
    expect(out['picked']!.dims).toEqual([4, 4]);
  });

  it.each<[string, { bias: 'none' | 'input'; beta?: number }]>([
    ['without C', { bias: 'none' }],
    ['with a C computed at run time and beta 2', { bias: 'input', beta: 2 }],
  ])('quantizes a Gemm %s to the same values as the float one', async (_, how) => {
    const random = new SeededRandom(12);
    const attribute: onnx.IAttributeProto[] =
      how.beta === undefined ? [] : [{ name: 'beta', type: onnx.AttributeProto.AttributeType.FLOAT, f: how.beta }];
    const model = encodeModel('gemm', {
      nodes: [
        ...(how.bias === 'input' ? [node('Relu', ['input'], ['c'], 'relu')] : []),
        node('Gemm', ['input', 'weight', ...(how.bias === 'input' ? ['c'] : [])], ['output'], 'gemm', attribute),
      ],
      initializers: [floatInitializer('weight', [8, 8], random.uniformFloat32(64, -0.5, 0.5))],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 8] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 8] }],
    });
    const sut = quantizeDynamic(model.bytes);
    expect(sut.quantized.map((q) => q.opType)).toEqual(['Gemm']);
    if (how.bias === 'input') expect(opTypes(sut.bytes).filter((op) => op === 'Mul')).toHaveLength(3);
    const input = uniform(3 * 8);
    expect(relativeL2(await run(model.bytes, input, [3, 8]), await run(sut.bytes, input, [3, 8]))).toBeLessThan(0.02);
  });

  it('quantizes a Conv per tensor, and one whose bias is computed at run time', async () => {
    const random = new SeededRandom(13);
    const ints = (name: string, values: number[]): onnx.IAttributeProto => ({
      name,
      type: onnx.AttributeProto.AttributeType.INTS,
      ints: values,
    });
    const model = encodeModel('conv-bias', {
      nodes: [
        node('ReduceMean', ['input'], ['bias_all'], 'mean', [
          ints('axes', [0, 2, 3]),
          { name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 0 },
        ]),
        node('Tile', ['bias_all', 'repeats'], ['bias'], 'tile'),
        node('Conv', ['input', 'w', 'bias'], ['output'], 'conv', [
          ints('kernel_shape', [3, 3]),
          ints('pads', [1, 1, 1, 1]),
        ]),
      ],
      initializers: [
        floatInitializer('w', [8, 8, 3, 3], random.uniformFloat32(8 * 8 * 9, -0.1, 0.1)),
        { name: 'repeats', dims: [1], dataType: 7, rawData: new Uint8Array(BigInt64Array.of(1n).buffer) },
      ],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 8, 6, 6] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 8, 6, 6] }],
    });
    const sut = quantizeDynamic(model.bytes, { ops: ['Conv'], perChannel: false });
    expect(sut.quantized.map((q) => q.opType)).toEqual(['Conv']);
    expect(opTypes(sut.bytes)).toContain('Reshape');
    expect(graphOf(sut.bytes).initializer.find((t) => t.name === 'w_scale')!.dims).toEqual([]);
    const input = uniform(2 * 8 * 36);
    expect(
      relativeL2(await run(model.bytes, input, [2, 8, 6, 6]), await run(sut.bytes, input, [2, 8, 6, 6])),
    ).toBeLessThan(0.03);
  });

  it('keeps a MatMul of two activations in float, and quantizes the rest', () => {
    const random = new SeededRandom(9);
    const model = encodeModel('mixed', {
      nodes: [node('MatMul', ['input', 'w'], ['h'], 'dense'), node('MatMul', ['h', 'other'], ['output'], 'pairwise')],
      initializers: [floatInitializer('w', [4, 4], random.uniformFloat32(16, -1, 1))],
      inputs: [
        { name: 'input', datatype: 'FP32', shape: [-1, 4] },
        { name: 'other', datatype: 'FP32', shape: [4, 2] },
      ],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 2] }],
    });
    const sut = quantizeDynamic(model.bytes);
    expect(sut.quantized.map((q) => q.node)).toEqual(['dense']);
    expect(sut.keptFloat).toEqual([
      { node: 'pairwise', opType: 'MatMul', reason: 'its weight "other" is computed, not a constant initializer' },
    ]);
  });

  it("names added values so that none clashes with the graph's own", () => {
    const random = new SeededRandom(2);
    const model = encodeModel('clash', {
      // The graph already has a value named as the quantizer would name the activation's.
      nodes: [
        node('Relu', ['input'], ['input_quantized'], 'relu'),
        node('MatMul', ['input', 'w'], ['m'], 'mm'),
        node('Add', ['m', 'input_quantized'], ['output'], 'add'),
      ],
      initializers: [floatInitializer('w', [4, 4], random.uniformFloat32(16, -1, 1))],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 4] }],
    });
    const graph = graphOf(quantizeDynamic(model.bytes).bytes);
    const produced = graph.node.flatMap((n) => n.output);
    expect(new Set(produced).size).toBe(produced.length);
    const named = [...graph.node.map((n) => n.name), ...graph.initializer.map((t) => t.name)];
    expect(new Set(named).size).toBe(named.length);
    expect(named.filter((n) => produced.includes(n) || graph.input.some((v) => v.name === n))).toEqual([]);
  });

  it('refuses bytes that are not ONNX, an opset below 11, and a model with nothing to quantize', () => {
    expect(() => quantizeDynamic(Uint8Array.of(1, 2, 3))).toThrow(QuantizationError);
    const old = onnx.ModelProto.decode(buildTinyModel().bytes);
    old.opsetImport = [onnx.OperatorSetIdProto.create({ domain: '', version: 10 })];
    expect(() => quantizeDynamic(onnx.ModelProto.encode(old).finish())).toThrow(
      'the model imports ONNX opset 10; dynamic quantization needs opset 11 or later',
    );
    const identity = encodeModel('relu', {
      nodes: [node('Relu', ['input'], ['output'], 'relu')],
      initializers: [],
      inputs: [{ name: 'input', datatype: 'FP32', shape: [-1, 4] }],
      outputs: [{ name: 'output', datatype: 'FP32', shape: [-1, 4] }],
    });
    expect(() => quantizeDynamic(identity.bytes)).toThrow(
      'nothing to quantize: the model has no MatMul, Gemm node with a constant FP32 weight that can be quantized',
    );
  });

  it('keeps weights within ±63 by default, and uses the full ±127 with reduceRange false at half the rounding error', async () => {
    const weightOf = (bytes: Uint8Array) => {
      const graph = graphOf(bytes);
      const levels = graph.initializer.find((t) => t.name === 'fc0.weight_quantized')!;
      const scales = graph.initializer.find((t) => t.name === 'fc0.weight_scale')!;
      return {
        levels: new Int8Array(levels.rawData!.buffer, levels.rawData!.byteOffset, levels.rawData!.length),
        scales: floatValues(scales),
      };
    };
    const float = floatValues(graphOf(mlp.bytes).initializer.find((t) => t.name === 'fc0.weight')!);
    const columns = 128;
    const weightError = ({ levels, scales }: ReturnType<typeof weightOf>) =>
      relativeL2(
        float,
        Float32Array.from(levels, (level, i) => level * scales[i % columns]!),
      );

    const reduced = quantizeDynamic(mlp.bytes);
    const full = quantizeDynamic(mlp.bytes, { reduceRange: false });

    const reducedWeight = weightOf(reduced.bytes);
    const fullWeight = weightOf(full.bytes);
    expect(Math.max(...reducedWeight.levels.map(Math.abs))).toBe(63);
    expect(Math.max(...fullWeight.levels.map(Math.abs))).toBe(127);
    expect(weightError(reducedWeight) / weightError(fullWeight)).toBeGreaterThan(1.8);
    expect(weightError(reducedWeight) / weightError(fullWeight)).toBeLessThan(2.2);
    // 7-bit weights cannot overflow onnxruntime's uint8 × int8 kernel on any CPU: the answer is close on this one.
    const input = uniform(8 * 64);
    expect(relativeL2(await run(mlp.bytes, input, [8, 64]), await run(reduced.bytes, input, [8, 64]))).toBeLessThan(
      0.02,
    );
  });
});
