'use strict';
// An execution thread: a worker thread that holds onnxruntime-node InferenceSessions, one per execution
// instance of each model it hosts (a model with N instances has a session on N threads). Each
// instance gets a thread of its own unless WORKER_EXECUTION_THREADS caps them, when models share
// threads (model-runtime.threads.ts). Plain CommonJS that requires only onnxruntime-node
// and node built-ins, so that the same file runs under jest (from source) and in the compiled service
// (model-runtime.threads.ts locates it).
//
// Protocol (structured clone; tensor data as whole ArrayBuffers, transferred both ways):
//   thread -> main    { type: 'started', priorityKept? } once onnxruntime-node is loaded; priorityKept
//                     says why the thread could not take the nice value it was started with (workerData.nice)
//   main -> thread    { type: 'load', session, model: Uint8Array, provider, intraOpThreads, weightsDir? }
//                     weightsDir: the directory the model's external data (its large weights, kept in
//                     the artifact cache's copy of it: external-weights.ts) is read from
//   thread -> main    { type: 'loaded', session, inputs, outputs, outputNames } | { type: 'failed', session, message }
//   main -> thread    { type: 'run', id, session, feeds: WireTensor[], fetches: string[] }
//   thread -> main    { type: 'result', id, outputs: WireTensor[], computeMs } | { type: 'refused', id, message }
//   main -> thread    { type: 'unload', session }  ->  { type: 'unloaded', session }
//   main -> thread    { type: 'close' }
// `session` is an id the service chooses. onnxruntime-node 1.30's session.run() computes on this
// thread, so the sessions a thread hosts run one at a time; the service sends a session one run at a
// time and nothing for it after 'unload'. `computeMs` is the run itself, timed here.
// WireTensor: { name, type (onnxruntime type name), dims: number[], data: ArrayBuffer }; for 'string'
// tensors the data is the KServe BYTES layout (4-byte little-endian length, then the bytes, per element),
// decoded and encoded here so that the service's event loop never touches the elements.
//
// A session is released on 'unload' once its run in progress (if any) has finished. The thread ends
// itself on 'close', once every run has finished and every session is released. It is never
// terminated from outside while onnxruntime may be running: tearing down a thread under a pending
// native run aborts the whole process.
const { parentPort, workerData } = require('node:worker_threads');
const { readlinkSync } = require('node:fs');
const { getPriority, setPriority } = require('node:os');

/**
 * Schedules this thread `nice` steps below the thread that started it (at most 19), before
 * onnxruntime starts any operator thread from it (Linux threads inherit their creator's nice value),
 * so that under load the compute yields a core to the service's main thread. setpriority(2) takes a
 * thread id on Linux, which a thread reads from /proc/thread-self. Returns why it could not, or
 * undefined.
 */
function lowerPriority(nice) {
  if (!nice) return undefined;
  let tid;
  try {
    tid = Number(readlinkSync('/proc/thread-self').split('/').pop());
  } catch (error) {
    return `no /proc/thread-self to find the thread's id (${firstLine(error)})`;
  }
  try {
    setPriority(tid, Math.min(19, getPriority(tid) + nice));
  } catch (error) {
    return `setpriority(${tid}) failed: ${firstLine(error)}`;
  }
  return undefined;
}

const priorityKept = lowerPriority(workerData?.nice);
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

/** session id -> { session, running: Promise | undefined } */
const sessions = new Map();
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
  const session = sessions.get(message.session).session;
  let results;
  let computeMs = 0;
  try {
    const inputs = {};
    for (const wire of feeds) inputs[wire.name] = toOrt(wire);
    const start = performance.now();
    results = await session.run(inputs, fetches);
    computeMs = performance.now() - start;
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
    parentPort.postMessage({ type: 'result', id, outputs, computeMs }, transfer);
  } catch {
    // A buffer the binding does not let go of: send copies instead.
    parentPort.postMessage({
      type: 'result',
      id,
      outputs: outputs.map((o) => ({ ...o, data: o.data.slice(0) })),
      computeMs,
    });
  }
}

async function unload(id) {
  const entry = sessions.get(id);
  if (entry !== undefined) {
    sessions.delete(id);
    await entry.running;
    await entry.session.release().catch(() => undefined);
  }
  parentPort.postMessage({ type: 'unloaded', session: id });
}

async function close() {
  if (closing) return;
  closing = true;
  await Promise.all([...sessions.keys()].map(unload));
  parentPort.close(); // nothing left to do: the thread ends
}

function metadata(meta) {
  return meta.isTensor
    ? { name: meta.name, isTensor: true, type: meta.type, shape: Array.from(meta.shape, (d) => (typeof d === 'number' ? d : -1)) }
    : { name: meta.name, isTensor: false, type: '', shape: [] };
}

async function load(message) {
  const { session: id, model, provider, intraOpThreads, weightsDir } = message;
  let session;
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
      extra: {
        session: {
          intra_op: { allow_spinning: '0' },
          ...(weightsDir === undefined ? {} : { model_external_initializers_file_folder_path: weightsDir }),
        },
      },
    });
  } catch (error) {
    parentPort.postMessage({ type: 'failed', session: id, message: firstLine(error) });
    return;
  } finally {
    // The session holds what it needs. Free this thread's copy of the model now (detaching its buffer
    // frees it) rather than at the isolate's next full GC, which a quiet thread may not run for a long
    // time: until then the copy doubles what the model holds. (Bytes shared with the service, in a
    // SharedArrayBuffer, are not this thread's to free.)
    if (model.buffer instanceof ArrayBuffer) model.buffer.transfer(0);
  }
  if (closing) {
    await session.release().catch(() => undefined);
    return;
  }
  sessions.set(id, { session, running: undefined });
  parentPort.postMessage({
    type: 'loaded',
    session: id,
    inputs: session.inputMetadata.map(metadata),
    outputs: session.outputMetadata.map(metadata),
    outputNames: [...session.outputNames],
  });
}

parentPort.on('message', (message) => {
  switch (message.type) {
    case 'load':
      void load(message);
      break;
    case 'run': {
      const entry = sessions.get(message.session);
      if (entry === undefined) {
        parentPort.postMessage({ type: 'refused', id: message.id, message: 'the session is not loaded on this thread' });
        break;
      }
      // The service sends a session one run at a time and nothing for it after 'unload'.
      entry.running = run(message).finally(() => (entry.running = undefined));
      break;
    }
    case 'unload':
      void unload(message.session);
      break;
    case 'close':
      void close();
      break;
    default:
      // Nothing else is sent; an exception here would end the thread under a possibly running session.
      break;
  }
});
parentPort.postMessage({ type: 'started', ...(priorityKept !== undefined && { priorityKept }) });
