import { buildIntegerProbeModel, INTEGER_PROBE_DEPTH } from '@infermesh/model-builder';
import * as ort from 'onnxruntime-node';

/**
 * The integer probe's answer (its first column) from onnxruntime-node run directly in this process:
 * INTEGER_PROBE_EXACT where this CPU's uint8 × int8 kernel adds its products in 32 bits.
 */
export async function integerProbeAnswer(): Promise<number> {
  const session = await ort.InferenceSession.create(buildIntegerProbeModel().bytes);
  try {
    const a = new ort.Tensor('uint8', new Uint8Array(INTEGER_PROBE_DEPTH).fill(255), [1, INTEGER_PROBE_DEPTH]);
    return ((await session.run({ a }))['y']!.data as Int32Array)[0]!;
  } finally {
    await session.release();
  }
}
