import { create } from '@bufbuild/protobuf';
import { type Tensor, TensorSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeFromOrt, datatypeInfo, datatypeName } from '@infermesh/tensors';
import { Injectable } from '@nestjs/common';
import { InferenceSession, Tensor as OrtTensor } from 'onnxruntime-node';

/** The typed array onnxruntime-node takes for each tensor type the registry runs models on. */
const TYPED_ARRAYS: Record<string, new (buffer: ArrayBuffer) => ArrayLike<unknown>> = {
  float32: Float32Array,
  float64: Float64Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
  float16: Uint16Array,
};

/** A model's session in the registry: run it, then release it. */
export interface OnnxSession {
  run(inputs: readonly Tensor[]): Promise<Tensor[]>;
  release(): Promise<void>;
}

/**
 * onnxruntime-node behind a small seam: whether it can create a session from a model's bytes, as a
 * worker will, and a model's outputs on given inputs. Sessions run on one thread and are released
 * once used, so that an upload or a derivation does not take the registry's cores or memory for long.
 */
@Injectable()
export class OnnxRuntime {
  /** Resolves when onnxruntime can load the model; rejects with onnxruntime's error when it cannot. */
  async load(bytes: Uint8Array): Promise<void> {
    const session = await this.open(bytes);
    await session.release();
  }

  /**
   * A session of the model, to run on inputs and then release: its outputs come in the order of the
   * graph's outputs. Inputs of a datatype onnxruntime holds in a typed array only (not BYTES); rejects
   * with onnxruntime's error.
   */
  async session(bytes: Uint8Array): Promise<OnnxSession> {
    const session = await this.open(bytes);
    return {
      run: async (inputs) => {
        const feeds: Record<string, OrtTensor> = {};
        for (const input of inputs) feeds[input.name] = toOrt(input);
        const outputs = await session.run(feeds);
        return session.outputNames.map((name) => fromOrt(name, outputs[name]!));
      },
      release: () => session.release(),
    };
  }

  private open(bytes: Uint8Array): Promise<InferenceSession> {
    return InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1 });
  }
}

function toOrt(tensor: Tensor): OrtTensor {
  const type = datatypeInfo(tensor.datatype).ort;
  const array = TYPED_ARRAYS[type];
  if (array === undefined)
    throw new Error(
      `input "${tensor.name}" is ${datatypeName(tensor.datatype)}, which the registry does not run models on`,
    );
  // A copy of its own: aligned for the typed array.
  const data = new array(Uint8Array.from(tensor.data).buffer);
  return new OrtTensor(type as 'float32', data as Float32Array, tensor.shape.map(Number));
}

function fromOrt(name: string, tensor: OrtTensor): Tensor {
  const datatype = datatypeFromOrt(tensor.type);
  if (datatype === undefined || tensor.type === 'string')
    throw new Error(`output "${name}" has type ${tensor.type}, which the registry does not compare`);
  const data = tensor.data as ArrayLike<unknown> & ArrayBufferView;
  return create(TensorSchema, {
    name,
    datatype,
    shape: tensor.dims.map(BigInt),
    data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice(),
  });
}
