import * as ort from 'onnxruntime-node';
import { buildIntegerProbeModel, INTEGER_PROBE_DEPTH, INTEGER_PROBE_EXACT } from './integer-probe-model';

describe('buildIntegerProbeModel', () => {
  it('answers 64 · 255 · 127 in every column where products add in 32 bits, 32 saturated pairs where they add in 16', async () => {
    const session = await ort.InferenceSession.create(buildIntegerProbeModel().bytes);
    const a = new ort.Tensor('uint8', new Uint8Array(INTEGER_PROBE_DEPTH).fill(255), [1, INTEGER_PROBE_DEPTH]);
    const y = (await session.run({ a }))['y']!;
    await session.release();

    expect([y.type, y.dims]).toEqual(['int32', [1, 8]]);
    const columns = [...(y.data as Int32Array)];
    expect(new Set(columns).size).toBe(1);
    expect([INTEGER_PROBE_EXACT, (INTEGER_PROBE_DEPTH / 2) * 32_767]).toContain(columns[0]);
  });
});
