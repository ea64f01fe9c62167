import NodeEnvironment from 'jest-environment-node';

/**
 * Jest's node environment runs each spec in its own realm, so the typed arrays onnxruntime-node's
 * native binding returns fail onnxruntime-common's `instanceof Float32Array` checks ("A float32
 * tensor's data must be type of function Float32Array()"). This environment gives the spec's realm
 * the host's typed-array constructors. jest.config.js uses it for every spec.
 */
export default class OrtJestEnvironment extends NodeEnvironment {
  constructor(...args: ConstructorParameters<typeof NodeEnvironment>) {
    super(...args);
    const typedArrays: Record<string, unknown> = {
      Int8Array,
      Uint8Array,
      Uint8ClampedArray,
      Int16Array,
      Uint16Array,
      Int32Array,
      Uint32Array,
      Float32Array,
      Float64Array,
      BigInt64Array,
      BigUint64Array,
      ArrayBuffer,
      ...(typeof Float16Array === 'undefined' ? {} : { Float16Array }),
    };
    Object.assign(this.global, typedArrays);
  }
}
