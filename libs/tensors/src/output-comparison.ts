import { DataType, type Tensor } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { fromHalfBits } from './half-float';

/** How a shadow's outputs differ from the served ones. */
export interface Comparison {
  /** Batch items compared by their top class (rows of a 2-D floating-point output), and how many agreed. */
  items: number;
  agreed: number;
  /** Largest absolute difference of any floating-point element. */
  maxAbsDiff: number;
  /** ‖shadow − served‖₂ ÷ ‖served‖₂ over every floating-point element (0 when both are 0). */
  relativeL2: number;
  /** Of those, the rows of [batch, classes] outputs alone (top-1 agreement = topAgreed ÷ topRows). */
  topRows: number;
  topAgreed: number;
  /** Outputs that could not be compared element by element (another shape or datatype, or missing). */
  mismatched: number;
  /** ‖shadow − served‖₂² and ‖served‖₂², of which relativeL2 is the root of the ratio: what comparisons of several runs add up (addComparisons). */
  diffSquares: number;
  servedSquares: number;
}

/**
 * Compares a shadow's outputs with the served ones, output by output (by name). A floating-point
 * output of shape [batch, classes] is compared as classes: each row agrees when its top class is the
 * same. Any other output agrees or not as a whole, bit for bit, counted as one item.
 */
export function compareOutputs(served: readonly Tensor[], shadow: readonly Tensor[]): Comparison {
  const result: Comparison = {
    items: 0,
    agreed: 0,
    topRows: 0,
    topAgreed: 0,
    maxAbsDiff: 0,
    relativeL2: 0,
    mismatched: 0,
    diffSquares: 0,
    servedSquares: 0,
  };
  for (const a of served) {
    const b = shadow.find((t) => t.name === a.name);
    if (b === undefined || b.datatype !== a.datatype || b.shape.join(',') !== a.shape.join(',')) {
      result.mismatched += 1;
      continue;
    }
    const x = floats(a);
    const y = floats(b);
    if (x === undefined || y === undefined) {
      result.items += 1;
      if (Buffer.from(a.data).equals(Buffer.from(b.data))) result.agreed += 1;
      continue;
    }
    for (let i = 0; i < x.length; i++) {
      const d = y[i]! - x[i]!;
      result.maxAbsDiff = Math.max(result.maxAbsDiff, Math.abs(d));
      result.diffSquares += d * d;
      result.servedSquares += x[i]! * x[i]!;
    }
    if (a.shape.length === 2 && Number(a.shape[1]) > 1) {
      const width = Number(a.shape[1]);
      for (let row = 0; row < Number(a.shape[0]); row++) {
        result.items += 1;
        result.topRows += 1;
        if (argmax(x, row * width, width) === argmax(y, row * width, width)) {
          result.agreed += 1;
          result.topAgreed += 1;
        }
      }
    } else {
      result.items += 1;
      if (Buffer.from(a.data).equals(Buffer.from(b.data))) result.agreed += 1;
    }
  }
  result.relativeL2 = relativeL2(result.diffSquares, result.servedSquares);
  return result;
}

/** The comparison of several runs taken together: counts added, the largest difference, the error over all of their elements. */
export function addComparisons(a: Comparison, b: Comparison): Comparison {
  const diffSquares = a.diffSquares + b.diffSquares;
  const servedSquares = a.servedSquares + b.servedSquares;
  return {
    items: a.items + b.items,
    agreed: a.agreed + b.agreed,
    topRows: a.topRows + b.topRows,
    topAgreed: a.topAgreed + b.topAgreed,
    maxAbsDiff: Math.max(a.maxAbsDiff, b.maxAbsDiff),
    mismatched: a.mismatched + b.mismatched,
    diffSquares,
    servedSquares,
    relativeL2: relativeL2(diffSquares, servedSquares),
  };
}

function relativeL2(diffSquares: number, servedSquares: number): number {
  return diffSquares === 0 ? 0 : Math.sqrt(diffSquares) / Math.max(Math.sqrt(servedSquares), Number.MIN_VALUE);
}

function floats(tensor: Tensor): ArrayLike<number> | undefined {
  const bytes = Uint8Array.from(tensor.data);
  switch (tensor.datatype) {
    case DataType.FP32:
      return new Float32Array(bytes.buffer);
    case DataType.FP64:
      return new Float64Array(bytes.buffer);
    case DataType.FP16:
      return Array.from(new Uint16Array(bytes.buffer), fromHalfBits);
    default:
      return undefined;
  }
}

function argmax(values: ArrayLike<number>, start: number, width: number): number {
  let best = start;
  for (let i = start + 1; i < start + width; i++) if (values[i]! > values[best]!) best = i;
  return best - start;
}
