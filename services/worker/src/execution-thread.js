'use strict';
// One execution instance of a model: a worker thread holding one onnxruntime-node InferenceSession.
// Plain CommonJS that requires only onnxruntime-node and node built-ins, so that the same file runs
// under jest (from source) and in the compiled service (model-runtime.threads.ts locates it).
//
// Protocol (structured clone; numeric tensor data as whole ArrayBuffers, transferred):
//   workerData                     { model: Uint8Array, provider, intraOpThreads }
//   thread -> main                 { type: 'ready', inputs, outputs, outputNames } | { type: 'failed', message }
//   main -> thread                 { type: 'run', id, feeds: WireTensor[], fetches: string[] } | { type: 'release' }
//   thread -> main                 { type: 'result', id, outputs: WireTensor[] } | { type: 'refused', id, message } | { type: 'released' }
// WireTensor: { name, type (onnxruntime type name), dims: number[], data: ArrayBuffer | string[] }.
// Anything unexpected throws: the thread dies and the runtime replaces it.
const { parentPort, workerData } = require('node:worker_threads');
const ort = require('onnxruntime-node');

const ARRAYS = {
  bool: Uint8Array,
  uint8: Uint8Array,
  int8: Int8Array,
  uint16: Uint16Array,
  int16: Int16Array,
  uint32: Uint32Array,
  int32: Int32Array,
  uint64: BigUint64Array,
  int64: BigInt64Array,
  float16: Uint16Array,
  float32: Float32Array,
  float64: Float64Array,
};

let session;

function firstLine(error) {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0].trim();
}

function toOrt(wire) {
  if (wire.type === 'string') return new ort.Tensor('string', wire.data, wire.dims);
  const Array = ARRAYS[wire.type];
  if (Array === undefined) throw new TypeError(`tensor "${wire.name}": unsupported type ${wire.type}`);
  const data = new Array(wire.data);
  const tensor = new ort.Tensor(wire.type, data, wire.dims);
  if (wire.type === 'float16' && tensor.data !== data) {
    // Where Float16Array exists, onnxruntime-common wraps the bits in one, which the native binding
    // cannot read ("not enough space"); it reads the `data` property, so hand it the bits themselves.
    Object.defineProperty(tensor, 'data', { value: data });
  }
  return tensor;
}

/** The output as a wire tensor; its buffer joins `transfer` when the data owns it alone. */
function fromOrt(name, tensor, transfer) {
  const dims = Array.from(tensor.dims, Number);
  if (tensor.type === 'string') return { name, type: 'string', dims, data: Array.from(tensor.data) };
  const view = tensor.data;
  const whole = view.byteOffset === 0 && view.byteLength === view.buffer.byteLength && !transfer.includes(view.buffer);
  if (whole && view.buffer instanceof ArrayBuffer) {
    transfer.push(view.buffer);
    return { name, type: tensor.type, dims, data: view.buffer };
  }
  return { name, type: tensor.type, dims, data: copyOf(view) };
}

function copyOf(view) {
  return new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice().buffer;
}

async function run(message) {
  const { id, feeds, fetches } = message;
  let results;
  try {
    const inputs = {};
    for (const wire of feeds) inputs[wire.name] = toOrt(wire);
    results = await session.run(inputs, fetches);
  } catch (error) {
    parentPort.postMessage({ type: 'refused', id, message: firstLine(error) });
    return;
  }
  const outputs = [];
  const transfer = [];
  for (const name of fetches) {
    const value = results[name];
    if (value === undefined) {
      parentPort.postMessage({ type: 'refused', id, message: `the model produced no output "${name}"` });
      return;
    }
    outputs.push(fromOrt(name, value, transfer));
  }
  try {
    parentPort.postMessage({ type: 'result', id, outputs }, transfer);
  } catch {
    // A buffer the binding does not let go of: send copies instead.
    const copies = outputs.map((o) => (o.data instanceof ArrayBuffer ? { ...o, data: o.data.slice(0) } : o));
    parentPort.postMessage({ type: 'result', id, outputs: copies });
  }
}

function metadata(meta) {
  return meta.isTensor
    ? { name: meta.name, isTensor: true, type: meta.type, shape: Array.from(meta.shape, (d) => (typeof d === 'number' ? d : -1)) }
    : { name: meta.name, isTensor: false, type: '', shape: [] };
}

async function main() {
  const { model, provider, intraOpThreads } = workerData;
  try {
    session = await ort.InferenceSession.create(model, {
      executionProviders: [provider],
      intraOpNumThreads: intraOpThreads,
      interOpNumThreads: 1,
      graphOptimizationLevel: 'all',
      logSeverityLevel: 3,
      // Pool threads that spin after a run keep cores busy that the event loop and other instances
      // need; a server sharing its cores among many sessions is better off letting them sleep.
      extra: { session: { intra_op: { allow_spinning: '0' } } },
    });
  } catch (error) {
    parentPort.postMessage({ type: 'failed', message: firstLine(error) });
    return;
  }
  parentPort.on('message', (message) => {
    switch (message.type) {
      case 'run':
        void run(message);
        break;
      case 'release':
        void session.release().finally(() => parentPort.postMessage({ type: 'released' }));
        break;
      default:
        throw new Error(`execution thread: unknown message type ${String(message.type)}`);
    }
  });
  parentPort.postMessage({
    type: 'ready',
    inputs: session.inputMetadata.map(metadata),
    outputs: session.outputMetadata.map(metadata),
    outputNames: [...session.outputNames],
  });
}

void main();
