import { create } from '@bufbuild/protobuf';
import { buildMlpModel, buildTinyModel } from '@infermesh/model-builder';
import { TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { DataType } from '@infermesh/tensors';
import { onnx } from 'onnx-proto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EXTERNAL_WEIGHT_MIN_BYTES, externalWeights } from './external-weights';
import { ModelLoadError } from './model-runtime';
import { ThreadsModelRuntime } from './model-runtime.threads';

const MLP = buildMlpModel({ sizes: [64, 512, 8], name: 'ext' });

describe('externalWeights', () => {
  it('points each large initializer at its own bytes in the file and keeps the small ones inside', () => {
    const small = externalWeights(MLP.bytes, 'ext.onnx')!;
    expect(small.byteLength).toBeLessThan(EXTERNAL_WEIGHT_MIN_BYTES);
    const before = onnx.ModelProto.decode(MLP.bytes).graph!.initializer!;
    const after = onnx.ModelProto.decode(small).graph!.initializer!;
    expect(after.map((t) => t.name)).toEqual(before.map((t) => t.name));
    let moved = 0;
    for (const [i, tensor] of after.entries()) {
      const raw = before[i]!.rawData!;
      if (raw.byteLength < EXTERNAL_WEIGHT_MIN_BYTES) {
        expect(Buffer.from(tensor.rawData!)).toEqual(Buffer.from(raw));
        continue;
      }
      moved += 1;
      expect(tensor.dataLocation).toBe(onnx.TensorProto.DataLocation.EXTERNAL);
      expect(tensor.rawData!.byteLength).toBe(0);
      const entries = Object.fromEntries(tensor.externalData!.map((e) => [e.key, e.value]));
      expect(entries['location']).toBe('ext.onnx');
      const offset = Number(entries['offset']);
      expect(Buffer.from(MLP.bytes.subarray(offset, offset + Number(entries['length'])))).toEqual(Buffer.from(raw));
      // Everything else about the tensor is as it was.
      expect({ ...tensor, rawData: undefined, externalData: undefined, dataLocation: undefined }).toEqual({
        ...before[i]!,
        rawData: undefined,
        externalData: undefined,
        dataLocation: undefined,
      });
    }
    expect(moved).toBe(1); // the 64×512 weight (128 KiB); the 512×8 one (16 KiB) and the biases stay inside
  });

  it('copies fields it does not know as they are', () => {
    const unknown = Buffer.from([0x98, 0x06, 0x05]); // field 99, varint 5: no field of ModelProto today
    const small = externalWeights(Buffer.concat([MLP.bytes, unknown]), 'ext.onnx')!;
    expect(Buffer.from(small.subarray(-3))).toEqual(unknown);
  });

  it('leaves alone a model with no large initializer, and bytes that are not a protobuf it can read', () => {
    expect(externalWeights(buildTinyModel().bytes, 'tiny.onnx')).toBeUndefined();
    expect(externalWeights(Buffer.from('not a model at all'), 'x.onnx')).toBeUndefined();
    expect(externalWeights(MLP.bytes.subarray(0, MLP.bytes.byteLength - 10), 'x.onnx')).toBeUndefined();
  });

  describe('loaded by the execution threads', () => {
    const runtime = new ThreadsModelRuntime({ instancesPerModel: 1, intraOpThreads: 1 });
    const dir = mkdtempSync(join(tmpdir(), 'external-weights-'));
    writeFileSync(join(dir, 'ext.onnx'), MLP.bytes);
    afterAll(async () => {
      await runtime.close();
      rmSync(dir, { recursive: true, force: true });
    });
    const input = create(TensorSchema, {
      name: 'input',
      datatype: DataType.FP32,
      shape: [3n, 64n],
      data: Buffer.from(Float32Array.from({ length: 3 * 64 }, (_, i) => Math.sin(i)).buffer),
    });

    it('answers exactly as the model loaded from its bytes', async () => {
      const whole = await runtime.load(MLP.bytes, ['cpu']);
      const external = await runtime.load(externalWeights(MLP.bytes, 'ext.onnx')!, ['cpu'], undefined, {
        weightsDir: dir,
      });
      try {
        const [a] = (await whole.run([input], [])).outputs;
        const [b] = (await external.run([input], [])).outputs;
        expect(Buffer.from(b!.data)).toEqual(Buffer.from(a!.data));
      } finally {
        await whole.release();
        await external.release();
      }
    });

    it('refuses the load when the file is not there, so that the worker loads the bytes instead', async () => {
      await expect(
        runtime.load(externalWeights(MLP.bytes, 'gone.onnx')!, ['cpu'], undefined, { weightsDir: dir }),
      ).rejects.toThrow(ModelLoadError);
    });
  });
});
