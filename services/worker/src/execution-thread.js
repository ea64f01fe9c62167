'use strict';
// One execution instance of a model: a worker thread holding one onnxruntime-node InferenceSession.
// Plain CommonJS that requires only onnxruntime-node and node built-ins, so that the same file runs
// under jest (from source) and in the compiled service (model-runtime.threads.ts locates it).
//
// Protocol (structured clone; tensor data as whole ArrayBuffers, transferred both ways):
//   workerData        { model: Uint8Array, provider, intraOpThreads }
//   thread -> main    { type: 'ready', inputs, outputs, outputNames } | { type: 'failed', message }
//   main -> thread    { type: 'run', id, feeds: WireTensor[], fetches: string[] } | { type: 'close' }
//   thread -> main    { type: 'result', id, outputs: WireTensor[] } | { type: 'refused', id, message }
// WireTensor: { name, type (onnxruntime type name), dims: number[], data: ArrayBuffer }; for 'string'
// tensors the data is the KServe BYTES layout (4-byte little-endian length, then the bytes, per element),
// decoded and encoded here so that the service's event loop never touches the elements.
//
// The thread always ends itself: after 'failed', or on 'close' once the run in progress (if any) has
// finished and the session is released. It is never terminated from outside while onnxruntime may be
// running: tearing down a thread under a pending native run aborts the whole process.
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
let running;
let closing = false;

function firstLine(error) {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0].trim();
}

/** KServe BYTES layout -> strings; throws when the bytes do not hold `count` elements. */
function decodeStrings(name, buffer, count) {
  const bytes = Buffer.from(buffer);
  const strings = [];
  let offset = 0;
  while (offset < bytes.length) {
    if (offset + 4 > bytes.length) break;
    const length = bytes.readUInt32LE(offset);
    offset += 4;
    if (offset + length > bytes.length) break;
    strings.push(bytes.toString('utf8', offset, offset + length));
    offset += length;
  }
  if (offset !== bytes.length || strings.length !== count) {
    throw new RangeError(`tensor "${name}": BYTES data does not hold ${count} length-prefixed elements`);
  }
  return strings;
}

/** Strings -> KServe BYTES layout, in a buffer of its own. */
function encodeStrings(strings) {
  const parts = strings.map((s) => Buffer.from(s, 'utf8'));
  const out = new Uint8Array(parts.reduce((n, p) => n + 4 + p.length, 0));
  const view = new DataView(out.buffer);
  let offset = 0;
  for (const part of parts) {
    view.setUint32(offset, part.length, true);
    out.set(part, offset + 4);
    offset += 4 + part.length;
  }
  return out.buffer;
}

function toOrt(wire) {
  if (wire.type === 'string') {
    const count = wire.dims.reduce((a, b) => a * b, 1);
    return new ort.Tensor('string', decodeStrings(wire.name, wire.data, count), wire.dims);
  }
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
  if (tensor.type === 'string') {
    const data = encodeStrings(Array.from(tensor.data));
    transfer.push(data);
    return { name, type: 'string', dims, data };
  }
  const view = tensor.data;
  const whole = view.byteOffset === 0 && view.byteLength === view.buffer.byteLength && !transfer.includes(view.buffer);
  if (whole && view.buffer instanceof ArrayBuffer) {
    transfer.push(view.buffer);
    return { name, type: tensor.type, dims, data: view.buffer };
  }
  const copy = new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice().buffer;
  transfer.push(copy);
  return { name, type: tensor.type, dims, data: copy };
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
    parentPort.postMessage({ type: 'result', id, outputs: outputs.map((o) => ({ ...o, data: o.data.slice(0) })) });
  }
}

async function close() {
  if (closing) return;
  closing = true;
  await running;
  await session.release().catch(() => undefined);
  parentPort.close(); // nothing left to do: the thread ends
}

function metadata(meta) {
  return meta.isTensor
    ? { name: meta.name, isTensor: true, type: meta.type, shape: Array.from(meta.shape, (d) => (typeof d === 'number' ? d : -1)) }
    : { name: meta.name, isTensor: false, type: '', shape: [] };
}

async function main() {
  const { model, provider, intraOpThreads } = workerData;
  delete workerData.model;
  try {
    session = await ort.InferenceSession.create(model, {
      executionProviders: [provider],
      intraOpNumThreads: intraOpThreads,
      interOpNumThreads: 1,
      graphOptimizationLevel: 'all',
      // Fatal only: a run the model refuses is answered as INVALID_ARGUMENT with ORT's message, not logged again.
      logSeverityLevel: 4,
      // Pool threads that spin after a run keep cores busy that the event loop and other instances
      // need; a server sharing its cores among many sessions is better off letting them sleep.
      extra: { session: { intra_op: { allow_spinning: '0' } } },
    });
  } catch (error) {
    parentPort.postMessage({ type: 'failed', message: firstLine(error) });
    parentPort.close();
    return;
  } finally {
    // The session holds what it needs. Free this thread's copy of the model now (detaching its buffer
    // frees it) rather than at the isolate's next full GC, which an idle thread may not run for a long
    // time: until then the copy doubles what the model holds. (Bytes shared with the service, in a
    // SharedArrayBuffer, are not this thread's to free.)
    if (model.buffer instanceof ArrayBuffer) model.buffer.transfer(0);
  }
  parentPort.on('message', (message) => {
    switch (message.type) {
      case 'run':
        // The service sends one run at a time and nothing after 'close'.
        running = run(message).finally(() => (running = undefined));
        break;
      case 'close':
        void close();
        break;
      default:
        // Nothing else is sent; an exception here would end the thread under a possibly running session.
        break;
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
