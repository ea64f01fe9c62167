import type { AccuracyReport } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { DataType, datatypeInfo } from '@infermesh/tensors';
import { onnx } from 'onnx-proto';
import { endianness } from 'node:os';

/** The ONNX element types the quantizer writes. */
const ONNX_TYPE = {
  FP32: datatypeInfo(DataType.FP32).onnx,
  UINT8: datatypeInfo(DataType.UINT8).onnx,
  INT8: datatypeInfo(DataType.INT8).onnx,
  INT64: datatypeInfo(DataType.INT64).onnx,
} as const;

/** The operators whose constant weights dynamic quantization turns to 8 bits. */
export type QuantizableOp = 'MatMul' | 'Gemm' | 'Conv';
export const QUANTIZABLE_OPS: readonly QuantizableOp[] = ['MatMul', 'Gemm', 'Conv'];

export interface DynamicQuantizationOptions {
  /** One scale per output channel (column of a MatMul or Gemm weight, filter of a Conv); false: one per weight. Default true. */
  perChannel?: boolean;
  /**
   * The operators to quantize; default DEFAULT_QUANTIZED_OPS. A node of a quantizable operator not
   * among them stays in float and is listed in keptFloat with the reason.
   */
  ops?: readonly QuantizableOp[];
  /**
   * Weights in 7 bits (-63 to 63) rather than 8. Default true: onnxruntime's uint8 × int8 kernel on
   * x86 CPUs with AVX2 but not VNNI adds pairs of products in 16 bits, which full-range weights
   * overflow (on such a CPU the demo MLP's relative L2 error is 9 to 17 % with 8-bit weights, 1.5 %
   * with 7-bit ones), and whoever quantizes cannot know every CPU the model will run on. 7-bit
   * weights cannot overflow it, at about twice the rounding error of 8-bit ones; false suits workers
   * whose x86 CPUs all have VNNI.
   */
  reduceRange?: boolean;
}

/**
 * MatMul and Gemm, not Conv: onnxruntime's integer convolution (ConvInteger, the form dynamic
 * quantization takes) runs slower than its float Conv on CPU (0.46 to 0.85 times the items/s on the
 * CNN of cnn-model.ts, `npm run bench -- quantization`), and a worker holds no less memory for it:
 * only the artifact is smaller.
 */
export const DEFAULT_QUANTIZED_OPS: readonly QuantizableOp[] = ['MatMul', 'Gemm'];

/** A node whose weight was quantized. */
export interface QuantizedNodeReport {
  readonly node: string;
  readonly opType: QuantizableOp;
  readonly weight: string;
  /** Elements of the weight. */
  readonly elements: number;
}

/** A node of a quantizable operator that stays in float, and why. */
export interface FloatNodeReport {
  readonly node: string;
  readonly opType: string;
  readonly reason: string;
}

export interface DynamicQuantizationResult {
  /** The quantized model's bytes: valid ONNX with the source's inputs and outputs. */
  readonly bytes: Uint8Array;
  readonly quantized: readonly QuantizedNodeReport[];
  readonly keptFloat: readonly FloatNodeReport[];
  /** Bytes of the initializers before and after. */
  readonly weightBytesBefore: number;
  readonly weightBytesAfter: number;
}

/** A model that cannot be quantized at all: not ONNX, an opset too old, nothing to quantize. */
export class QuantizationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'QuantizationError';
  }
}

/**
 * "relative L2 0.0108, max abs diff 0.0412, top-1 agreement 99.2 % (248 of 250), 4 synthetic samples":
 * a derived model's figures for messages and `models show`.
 */
export function describeAccuracy(report: AccuracyReport): string {
  const figure = (value: number) => (value === 0 ? '0' : value.toPrecision(3));
  const parts = [`relative L2 ${figure(report.relativeL2)}`, `max abs diff ${figure(report.maxAbsDiff)}`];
  if (report.comparedItems > 0) {
    parts.push(
      `top-1 agreement ${((100 * report.agreedItems) / report.comparedItems).toFixed(1)} % (${report.agreedItems} of ${report.comparedItems})`,
    );
  }
  parts.push(`${report.samples} ${report.synthetic ? 'synthetic ' : ''}sample${report.samples === 1 ? '' : 's'}`);
  return parts.join(', ');
}

/** The most reasons a QuantizationError lists; the rest are counted. */
const MAX_LISTED_REASONS = 5;

/** DynamicQuantizeLinear appeared in opset 11. */
const MIN_OPSET = 11;
const INT8_MAX = 127;
const INT7_MAX = 63;
/** The zero point of the uint8 weights ConvInteger takes: symmetric around 128. */
const UINT8_WEIGHT_ZERO_POINT = 128;
const CAST_TO_FLOAT: onnx.IAttributeProto = {
  name: 'to',
  type: onnx.AttributeProto.AttributeType.INT,
  i: ONNX_TYPE.FP32,
};

/**
 * Dynamic int8 quantization of an ONNX model, in the way of onnxruntime's quantize_dynamic: the
 * constant FP32 weights of MatMul and Gemm (and Conv when asked, see DEFAULT_QUANTIZED_OPS) are stored
 * as 8-bit integers with a scale per output channel, symmetric (zero point 0; 128 for the uint8
 * weights of ConvInteger); their float activations are quantized at run time to uint8 by
 * DynamicQuantizeLinear (shared by every node that reads the same activation), multiplied in
 * integers (MatMulInteger, ConvInteger), and scaled back to float. Every other node, and every
 * candidate it cannot quantize (a weight that is not a constant FP32 initializer, a Gemm with transA,
 * a Conv that is not 2-D...), stays as it was, listed in keptFloat with the reason. The inputs and
 * outputs keep their names, types and shapes; float weights no node reads any more are dropped.
 * Throws QuantizationError for bytes that are not an ONNX model, an opset below 11, or a model with
 * nothing to quantize.
 */
export function quantizeDynamic(
  modelBytes: Uint8Array,
  options: DynamicQuantizationOptions = {},
): DynamicQuantizationResult {
  const model = decodeModel(modelBytes);
  // Decoded messages are class instances: their repeated fields are arrays, their strings strings.
  const graph = model.graph as onnx.GraphProto;
  const opset = defaultOpset(model);
  if (opset < MIN_OPSET) {
    throw new QuantizationError(
      `the model imports ONNX opset ${opset}; dynamic quantization needs opset ${MIN_OPSET} or later (DynamicQuantizeLinear)`,
    );
  }
  const ops = new Set(options.ops ?? DEFAULT_QUANTIZED_OPS);
  const rewriter = new GraphRewriter(
    graph,
    options.perChannel ?? true,
    options.reduceRange === false ? INT8_MAX : INT7_MAX,
  );
  const weightBytesBefore = initializerBytes(graph.initializer);
  const nodes: onnx.INodeProto[] = [];
  for (const original of graph.node as onnx.NodeProto[]) {
    // Only the standard operators: a MatMul or Conv of another domain is that domain's own.
    const opType = original.domain === '' || original.domain === 'ai.onnx' ? (original.opType ?? '') : '';
    let replacement: onnx.INodeProto[] | undefined;
    if (ops.has(opType as QuantizableOp)) replacement = rewriter.quantize(original, opType as QuantizableOp);
    else if (QUANTIZABLE_OPS.includes(opType as QuantizableOp))
      rewriter.keep(original, opType, `${opType} is not among the operators asked for (${[...ops].join(', ')})`);
    nodes.push(...(replacement ?? [original]));
  }
  if (rewriter.quantized.length === 0) {
    const why = rewriter.keptFloat.slice(0, MAX_LISTED_REASONS).map((n) => `${n.opType} "${n.node}": ${n.reason}`);
    const more = rewriter.keptFloat.length - why.length;
    if (more > 0) why.push(`and ${more} more`);
    throw new QuantizationError(
      `nothing to quantize: the model has no ${[...ops].join(', ')} node with a constant FP32 weight that can be quantized${why.length > 0 ? ` (${why.join('; ')})` : ''}`,
    );
  }
  graph.node = nodes;
  graph.initializer = [...graph.initializer, ...rewriter.added] as onnx.TensorProto[];
  dropUnread(graph);
  const bytes = new Uint8Array(onnx.ModelProto.encode(model).finish());
  return {
    bytes,
    quantized: rewriter.quantized,
    keptFloat: rewriter.keptFloat,
    weightBytesBefore,
    weightBytesAfter: initializerBytes(graph.initializer),
  };
}

/** A weight quantized to 8 bits: integers, one scale per channel (or one), and the zero point. */
interface QuantizedWeight {
  values: Int8Array | Uint8Array;
  /** The dimensions it is stored with. */
  dims: readonly number[];
  scales: Float32Array;
}

/** A weight's quantized initializers in the graph. */
interface StoredWeight {
  weightName: string;
  weight: QuantizedWeight;
  values: string;
  zeroPoint: string;
  /** The scales initializer by the factor folded into it (a Gemm's alpha). */
  scales: Map<number, string>;
}

/**
 * Rewrites quantizable nodes one at a time, keeping one set of value names so that every name it
 * adds is new, and one DynamicQuantizeLinear per activation.
 */
class GraphRewriter {
  readonly quantized: QuantizedNodeReport[] = [];
  readonly keptFloat: FloatNodeReport[] = [];
  readonly added: onnx.ITensorProto[] = [];
  private readonly names = new Set<string>();
  private readonly initializers = new Map<string, onnx.TensorProto>();
  private readonly graphInputs = new Set<string>();
  /** Quantized weights by the weight and the layout they are stored in. */
  private readonly storedWeights = new Map<string, StoredWeight>();
  /** Activation name -> the names of its quantized value, scale and zero point. */
  private readonly quantizedActivations = new Map<string, { value: string; scale: string; zeroPoint: string }>();

  constructor(
    graph: onnx.GraphProto,
    private readonly perChannel: boolean,
    /** The largest magnitude of a quantized weight: 127, or 63 for a reduced range. */
    private readonly maxLevel: number,
  ) {
    for (const tensor of graph.initializer as onnx.TensorProto[]) this.initializers.set(tensor.name, tensor);
    for (const value of graph.input as onnx.ValueInfoProto[]) this.graphInputs.add(value.name);
    // Every name of the graph and of its subgraphs (If, Loop, Scan bodies), which may read the outer graph's values.
    forEachGraph(graph, (g) => {
      for (const value of [...(g.input ?? []), ...(g.output ?? []), ...(g.valueInfo ?? [])])
        if (value.name) this.names.add(value.name);
      for (const tensor of [...(g.initializer ?? []), ...(g.sparseInitializer ?? []).map((t) => t.values)])
        if (tensor?.name) this.names.add(tensor.name);
      for (const n of g.node ?? []) {
        for (const name of [...(n.input ?? []), ...(n.output ?? [])]) this.names.add(name);
        if (n.name) this.names.add(n.name);
      }
    });
  }

  /** Records that `original` stays in float, and why. */
  keep(original: onnx.INodeProto, opType: string, reason: string): undefined {
    this.keptFloat.push({ node: nameOf(original, opType), opType, reason });
    return undefined;
  }

  /** The nodes that replace `original`, or undefined when it stays in float (recorded in keptFloat). */
  quantize(original: onnx.INodeProto, opType: QuantizableOp): onnx.INodeProto[] | undefined {
    const nodeName = nameOf(original, opType);
    const keep = (reason: string) => this.keep(original, opType, reason);
    const [activation, weightName] = original.input ?? [];
    if (activation === undefined || weightName === undefined || activation === '')
      return keep('it has fewer than two inputs');
    if (this.initializers.has(activation)) return keep('its first input is a constant, not an activation');
    const weight = this.initializers.get(weightName);
    if (weight === undefined) return keep(`its weight "${weightName}" is computed, not a constant initializer`);
    if (weight.dataType !== ONNX_TYPE.FP32)
      return keep(`its weight "${weightName}" is not FP32 (ONNX type ${weight.dataType})`);
    if (weight.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL)
      return keep(`its weight "${weightName}" is stored outside the model file`);
    if (this.graphInputs.has(weightName))
      return keep(`its weight "${weightName}" is also a graph input, which a caller may override`);
    const dims = weight.dims.map(toNumber);
    switch (opType) {
      case 'MatMul':
        if (dims.length !== 2)
          return keep(`its weight "${weightName}" has rank ${dims.length}; only 2-D weights are quantized`);
        return this.matMul(
          original,
          nodeName,
          activation,
          this.stored(`${weightName} as columns`, weightName, () =>
            this.quantizeColumns(floatValues(weight), dims[0]!, dims[1]!),
          ),
          1,
          undefined,
        );
      case 'Gemm': {
        if (attributeInt(original, 'transA', 0) !== 0) return keep('it transposes its first input (transA)');
        if (dims.length !== 2) return keep(`its weight "${weightName}" has rank ${dims.length}`);
        const transB = attributeInt(original, 'transB', 0) !== 0;
        const [k, n] = transB ? [dims[1]!, dims[0]!] : [dims[0]!, dims[1]!];
        const stored = this.stored(`${weightName} as ${transB ? 'rows' : 'columns'}`, weightName, () =>
          this.quantizeColumns(transB ? transpose(floatValues(weight), dims[0]!, dims[1]!) : floatValues(weight), k, n),
        );
        return this.matMul(original, nodeName, activation, stored, attributeFloat(original, 'alpha', 1), {
          bias: original.input?.[2],
          beta: attributeFloat(original, 'beta', 1),
        });
      }
      case 'Conv': {
        if (dims.length !== 4)
          return keep(`only 2-D convolutions are quantized; its weight "${weightName}" has rank ${dims.length}`);
        return this.conv(
          original,
          nodeName,
          activation,
          this.stored(`${weightName} as filters`, weightName, () => this.quantizeFilters(floatValues(weight), dims)),
        );
      }
    }
  }

  /**
   * A weight's quantized initializers, added once however many nodes read it the same way (tied
   * weights stay tied), with its scales by the factor folded into them.
   */
  private stored(key: string, weightName: string, quantize: () => QuantizedWeight): StoredWeight {
    let stored = this.storedWeights.get(key);
    if (stored === undefined) {
      const weight = quantize();
      const uint8 = weight.values instanceof Uint8Array;
      stored = {
        weightName,
        weight,
        values: this.addInitializer(
          `${weightName}_quantized`,
          uint8 ? ONNX_TYPE.UINT8 : ONNX_TYPE.INT8,
          weight.dims,
          weight.values,
        ),
        zeroPoint: uint8
          ? this.addInitializer(`${weightName}_zero_point`, ONNX_TYPE.UINT8, [], Uint8Array.of(UINT8_WEIGHT_ZERO_POINT))
          : this.addInitializer(`${weightName}_zero_point`, ONNX_TYPE.INT8, [], new Int8Array(1)),
        scales: new Map(),
      };
      this.storedWeights.set(key, stored);
    }
    return stored;
  }

  /** The initializer of a stored weight's scales times `factor`, in the shape its operator broadcasts them. */
  private scalesOf(stored: StoredWeight, factor: number, dims: readonly number[]): string {
    let name = stored.scales.get(factor);
    if (name === undefined) {
      name = this.addFloat(
        `${stored.weightName}_scale`,
        dims,
        stored.weight.scales.map((s) => s * factor),
      );
      stored.scales.set(factor, name);
    }
    return name;
  }

  private matMul(
    original: onnx.INodeProto,
    nodeName: string,
    activation: string,
    stored: StoredWeight,
    alpha: number,
    gemm: { bias: string | undefined; beta: number } | undefined,
  ): onnx.INodeProto[] {
    const nodes: onnx.INodeProto[] = [];
    const x = this.quantizedActivation(activation, nodes);
    const output = original.output![0]!;
    const { values: w, zeroPoint: wZeroPoint, weight, weightName } = stored;
    const wScale = this.scalesOf(stored, alpha, [weight.scales.length]);
    const integer = this.fresh(`${output}_int32`);
    const float = this.fresh(`${output}_unscaled`);
    const scale = this.fresh(`${output}_scale`);
    nodes.push(
      node('MatMulInteger', [x.value, w, x.zeroPoint, wZeroPoint], [integer], this.fresh(`${nodeName}_quant`)),
      node('Cast', [integer], [float], this.fresh(`${nodeName}_cast`), [CAST_TO_FLOAT]),
      node('Mul', [x.scale, wScale], [scale], this.fresh(`${nodeName}_scale`)),
    );
    const bias = gemm?.bias;
    if (bias === undefined || bias === '') {
      nodes.push(node('Mul', [float, scale], [output], this.fresh(`${nodeName}_rescale`)));
    } else {
      const scaled = this.fresh(`${output}_product`);
      nodes.push(node('Mul', [float, scale], [scaled], this.fresh(`${nodeName}_rescale`)));
      nodes.push(
        node(
          'Add',
          [scaled, this.scaledBias(bias, gemm!.beta, nodeName, nodes)],
          [output],
          this.fresh(`${nodeName}_bias`),
        ),
      );
    }
    this.quantized.push({
      node: nodeName,
      opType: gemm === undefined ? 'MatMul' : 'Gemm',
      weight: weightName,
      elements: weight.values.length,
    });
    return nodes;
  }

  private conv(
    original: onnx.INodeProto,
    nodeName: string,
    activation: string,
    stored: StoredWeight,
  ): onnx.INodeProto[] {
    const nodes: onnx.INodeProto[] = [];
    const x = this.quantizedActivation(activation, nodes);
    const output = original.output![0]!;
    const { values: w, zeroPoint: wZeroPoint, weight, weightName } = stored;
    const filters = weight.dims[0]!;
    const wScale = this.scalesOf(stored, 1, weight.scales.length === 1 ? [] : [filters, 1, 1]);
    const integer = this.fresh(`${output}_int32`);
    const float = this.fresh(`${output}_unscaled`);
    const scale = this.fresh(`${output}_scale`);
    const attributes = (original.attribute ?? []).filter((a) =>
      ['auto_pad', 'dilations', 'group', 'kernel_shape', 'pads', 'strides'].includes(a.name ?? ''),
    );
    nodes.push(
      node(
        'ConvInteger',
        [x.value, w, x.zeroPoint, wZeroPoint],
        [integer],
        this.fresh(`${nodeName}_quant`),
        attributes,
      ),
      node('Cast', [integer], [float], this.fresh(`${nodeName}_cast`), [CAST_TO_FLOAT]),
      node('Mul', [x.scale, wScale], [scale], this.fresh(`${nodeName}_scale`)),
    );
    const bias = original.input?.[2];
    if (bias === undefined || bias === '') {
      nodes.push(node('Mul', [float, scale], [output], this.fresh(`${nodeName}_rescale`)));
    } else {
      const scaled = this.fresh(`${output}_product`);
      nodes.push(node('Mul', [float, scale], [scaled], this.fresh(`${nodeName}_rescale`)));
      nodes.push(
        node(
          'Add',
          [scaled, this.channelBias(bias, filters, nodeName, nodes)],
          [output],
          this.fresh(`${nodeName}_bias`),
        ),
      );
    }
    this.quantized.push({ node: nodeName, opType: 'Conv', weight: weightName, elements: weight.values.length });
    return nodes;
  }

  /** The uint8 value, scale and zero point of an activation, from one DynamicQuantizeLinear added before its first quantized reader. */
  private quantizedActivation(activation: string, nodes: onnx.INodeProto[]) {
    let quantized = this.quantizedActivations.get(activation);
    if (quantized === undefined) {
      quantized = {
        value: this.fresh(`${activation}_quantized`),
        scale: this.fresh(`${activation}_scale`),
        zeroPoint: this.fresh(`${activation}_zero_point`),
      };
      nodes.push(
        node(
          'DynamicQuantizeLinear',
          [activation],
          [quantized.value, quantized.scale, quantized.zeroPoint],
          this.fresh(`${activation}_dynamic_quantize`),
        ),
      );
      this.quantizedActivations.set(activation, quantized);
    }
    return quantized;
  }

  /** Gemm's C times beta: folded into a new initializer when C is one, else a Mul. */
  private scaledBias(bias: string, beta: number, nodeName: string, nodes: onnx.INodeProto[]): string {
    if (beta === 1) return bias;
    const constant = this.initializers.get(bias);
    if (constant !== undefined && constant.dataType === ONNX_TYPE.FP32) {
      return this.addFloat(
        `${bias}_beta`,
        constant.dims.map(toNumber),
        floatValues(constant).map((v) => v * beta),
      );
    }
    const betaName = this.addFloat(`${nodeName}_beta`, [], Float32Array.of(beta));
    const scaled = this.fresh(`${bias}_beta`);
    nodes.push(node('Mul', [bias, betaName], [scaled], this.fresh(`${nodeName}_beta`)));
    return scaled;
  }

  /** A Conv's bias [filters] as [filters, 1, 1], to add to its NCHW output. */
  private channelBias(bias: string, filters: number, nodeName: string, nodes: onnx.INodeProto[]): string {
    const constant = this.initializers.get(bias);
    if (constant !== undefined && constant.dataType === ONNX_TYPE.FP32)
      return this.addFloat(`${bias}_channels`, [filters, 1, 1], floatValues(constant));
    const shape = this.addInitializer(
      `${nodeName}_bias_shape`,
      ONNX_TYPE.INT64,
      [3],
      BigInt64Array.of(BigInt(filters), 1n, 1n),
    );
    const reshaped = this.fresh(`${bias}_channels`);
    nodes.push(node('Reshape', [bias, shape], [reshaped], this.fresh(`${nodeName}_bias_reshape`)));
    return reshaped;
  }

  /** A [rows, columns] weight as int8, symmetric, one scale per column (or one in all). */
  private quantizeColumns(values: Float32Array, rows: number, columns: number): QuantizedWeight {
    const { levels, scales } = this.symmetric(values, columns, (i) => i % columns);
    return { values: Int8Array.from(levels), dims: [rows, columns], scales };
  }

  /** A [filters, ...] weight as uint8 around 128 (what ConvInteger takes), symmetric, one scale per filter (or one in all). */
  private quantizeFilters(values: Float32Array, dims: readonly number[]): QuantizedWeight {
    const filters = dims[0]!;
    const perFilter = values.length / filters;
    const { levels, scales } = this.symmetric(values, filters, (i) => Math.floor(i / perFilter));
    return { values: Uint8Array.from(levels, (level) => UINT8_WEIGHT_ZERO_POINT + level), dims, scales };
  }

  /**
   * Symmetric quantization of `values` into levels from -maxLevel to maxLevel: one scale per channel
   * (`channelOf` an element's channel, of `channels`) when per channel, else one for all; a channel
   * of zeros gets scale 1.
   */
  private symmetric(
    values: Float32Array,
    channels: number,
    channelOf: (index: number) => number,
  ): { levels: Int8Array; scales: Float32Array } {
    const groupOf = this.perChannel ? channelOf : () => 0;
    const maxAbs = new Float32Array(this.perChannel ? channels : 1);
    for (let i = 0; i < values.length; i++) maxAbs[groupOf(i)] = Math.max(maxAbs[groupOf(i)]!, Math.abs(values[i]!));
    const scales = maxAbs.map((m) => (m > 0 ? m / this.maxLevel : 1));
    const levels = new Int8Array(values.length);
    for (let i = 0; i < values.length; i++)
      levels[i] = clamp(Math.round(values[i]! / scales[groupOf(i)]!), -this.maxLevel, this.maxLevel);
    return { levels, scales };
  }

  private addFloat(base: string, dims: readonly number[], values: Float32Array): string {
    return this.addInitializer(base, ONNX_TYPE.FP32, dims, values);
  }

  private addInitializer(
    base: string,
    dataType: number,
    dims: readonly number[],
    values: Float32Array | Int8Array | Uint8Array | BigInt64Array,
  ): string {
    const name = this.fresh(base);
    this.added.push({ name, dims: [...dims], dataType, rawData: littleEndian(values) });
    return name;
  }

  /** `base`, or `base_2`, `base_3`... : a name no value, initializer or node of the graph has yet. */
  private fresh(base: string): string {
    let name = base;
    for (let i = 2; this.names.has(name); i++) name = `${base}_${i}`;
    this.names.add(name);
    return name;
  }
}

/** A node's name for reports: its own, else its first output's. */
function nameOf(n: onnx.INodeProto, opType: string): string {
  return n.name || n.output?.[0] || opType;
}

function node(
  opType: string,
  input: string[],
  output: string[],
  name: string,
  attribute?: onnx.IAttributeProto[],
): onnx.INodeProto {
  return { opType, input, output, name, ...(attribute !== undefined && attribute.length > 0 && { attribute }) };
}

function decodeModel(bytes: Uint8Array): onnx.ModelProto {
  let model: onnx.ModelProto;
  try {
    model = onnx.ModelProto.decode(bytes);
  } catch (error) {
    throw new QuantizationError(
      `the artifact is not an ONNX model: ${error instanceof Error ? error.message : String(error)}`,
    );
  }
  if (model.graph === null || model.graph === undefined)
    throw new QuantizationError('the artifact is not an ONNX model: it has no graph');
  return model;
}

/** The version of the default ONNX operator set the model imports. */
function defaultOpset(model: onnx.ModelProto): number {
  const entry = model.opsetImport.find((o) => o.domain === '' || o.domain === 'ai.onnx');
  return entry === undefined ? 0 : toNumber(entry.version);
}

/** Drops the float initializers the rewrite left unread: read by no node (of the graph or its subgraphs) and named by no output. */
function dropUnread(graph: onnx.GraphProto): void {
  const read = new Set<string>();
  forEachGraph(graph, (g) => {
    for (const n of g.node ?? []) for (const input of n.input ?? []) read.add(input);
    for (const output of g.output ?? []) if (output.name) read.add(output.name);
  });
  const initializers = graph.initializer as onnx.TensorProto[];
  const unread = new Set(initializers.filter((t) => !read.has(t.name)).map((t) => t.name));
  graph.initializer = initializers.filter((t) => !unread.has(t.name));
  graph.input = (graph.input as onnx.ValueInfoProto[]).filter((v) => !unread.has(v.name));
}

/**
 * Calls `visit` on the graph and on every subgraph of its nodes' attributes, depth first. (Nodes the
 * rewrite added are plain objects, without the empty arrays of decoded ones.)
 */
function forEachGraph(graph: onnx.IGraphProto, visit: (graph: onnx.IGraphProto) => void): void {
  visit(graph);
  for (const n of graph.node ?? []) {
    for (const attribute of n.attribute ?? []) {
      if (attribute.g) forEachGraph(attribute.g, visit);
      for (const sub of attribute.graphs ?? []) forEachGraph(sub, visit);
    }
  }
}

/** A float initializer's values, from raw_data (little-endian) or float_data. */
export function floatValues(tensor: onnx.ITensorProto): Float32Array {
  const raw = tensor.rawData;
  if (raw !== null && raw !== undefined && raw.length > 0) {
    const copy = new Uint8Array(raw);
    if (endianness() === 'BE') for (let i = 0; i < copy.length; i += 4) copy.subarray(i, i + 4).reverse();
    return new Float32Array(copy.buffer, 0, copy.length / 4);
  }
  return Float32Array.from(tensor.floatData ?? []);
}

function initializerBytes(initializers: readonly onnx.ITensorProto[]): number {
  let total = 0;
  for (const t of initializers) {
    if (t.rawData !== null && t.rawData !== undefined && t.rawData.length > 0) total += t.rawData.length;
    else
      total +=
        4 * ((t.floatData?.length ?? 0) + (t.int32Data?.length ?? 0)) +
        8 * ((t.int64Data?.length ?? 0) + (t.doubleData?.length ?? 0));
  }
  return total;
}

function transpose(values: Float32Array, rows: number, columns: number): Float32Array {
  const out = new Float32Array(values.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < columns; c++) out[c * rows + r] = values[r * columns + c]!;
  return out;
}

function attributeInt(n: onnx.INodeProto, name: string, fallback: number): number {
  const attribute = n.attribute?.find((a) => a.name === name);
  return attribute === undefined ? fallback : toNumber(attribute.i);
}

function attributeFloat(n: onnx.INodeProto, name: string, fallback: number): number {
  const attribute = n.attribute?.find((a) => a.name === name);
  return attribute?.f ?? fallback;
}

function littleEndian(values: Float32Array | Int8Array | Uint8Array | BigInt64Array): Uint8Array {
  const bytes = new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
  const width = values.BYTES_PER_ELEMENT;
  if (width > 1 && endianness() === 'BE')
    for (let i = 0; i < bytes.length; i += width) bytes.subarray(i, i + width).reverse();
  return bytes;
}

const clamp = (value: number, low: number, high: number) => Math.min(high, Math.max(low, value));

/** A protobufjs int64 (a number or a Long) as a number. */
function toNumber(value: number | { toNumber(): number } | null | undefined): number {
  if (value === null || value === undefined) return 0;
  return typeof value === 'number' ? value : value.toNumber();
}
