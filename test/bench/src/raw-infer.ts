import { performance } from 'node:perf_hooks';
import { create, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { CLIENT_FLOW_CONTROL_OPTIONS, messageLimits, methodPath } from '@infermesh/grpc';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { API_KEY } from '../../e2e/support/system-fixture';

/**
 * ModelInfer as a bare grpc-js client makes it: request bytes encoded once, sent as they are, the
 * answer's bytes not decoded. What the benchmarks' own client costs per call is then little more
 * than grpc-js's, and the machine's CPU goes to what is measured.
 */
export const INFER_PATH = methodPath(GRPCInferenceService.method.modelInfer);
export const SERVER_LIVE_PATH = methodPath(GRPCInferenceService.method.serverLive);
export const identity = (bytes: Buffer) => bytes;

/**
 * A bare grpc-js client of `address` (plaintext), on a connection of its own (grpc-js otherwise
 * shares one connection among clients of the same address and options), that opens its HTTP/2
 * receive window as the services' clients do (CLIENT_FLOW_CONTROL_OPTIONS). With grpc-js's default
 * 64 KiB, every answer on a busy connection waited for the client to acknowledge the last 32 KiB: under
 * the batching benchmark's overload, answers queued in the gateway for up to a second behind the
 * window, and a ServerLive on the same connection took as long as an inference (gRPC's C and Go
 * clients grow their window by themselves; grpc-js does not).
 */
export function rawClient(address: string): grpc.Client {
  return new grpc.Client(address, grpc.credentials.createInsecure(), {
    ...messageLimits(),
    ...CLIENT_FLOW_CONTROL_OPTIONS,
    'grpc.use_local_subchannel_pool': 1,
  });
}

/**
 * A seed as two input elements, each exact as a float32: its low 16 bits and the rest. A float32
 * holds every integer only up to 2^24, and the benchmarks' seeds go far above it.
 */
export function seedElements(seed: number): [number, number] {
  return [seed % 65_536, Math.floor(seed / 65_536)];
}

/**
 * Encoded ModelInferRequests of one item of `model`, its input all ones but the first two elements,
 * which hold the seed (seedElements): a request of its own for each seed (a copy of one encoding with
 * the seed written in), so that no cache answers one.
 */
export function seededRequests(model: string, item: readonly number[]): (seed: number) => Buffer {
  const data = new Float32Array(item.reduce((a, b) => a * b, 1)).fill(1);
  const template = Buffer.from(
    toBinary(
      ModelInferRequestSchema,
      create(ModelInferRequestSchema, {
        modelName: model,
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, ...item.map(BigInt)] }],
        rawInputContents: [new Uint8Array(data.buffer)],
      }),
    ),
  );
  const dataOffset = template.length - data.byteLength; // raw_input_contents is the request's last field
  return (seed) => {
    const bytes = Buffer.from(template);
    const [low, high] = seedElements(seed);
    bytes.writeFloatLE(low, dataOffset);
    bytes.writeFloatLE(high, dataOffset + 4);
    return bytes;
  };
}

/** A ModelInfer call with the request's bytes as they are, and the caller's key. Fails with grpc-js's ServiceError. */
export function unary(client: grpc.Client, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  const metadata = new grpc.Metadata();
  metadata.set('authorization', `Bearer ${API_KEY}`);
  return new Promise((resolve, reject) =>
    client.makeUnaryRequest(
      INFER_PATH,
      identity,
      identity,
      bytes,
      metadata,
      { deadline: Date.now() + timeoutMs },
      (error, answer) =>
        error === null && answer !== undefined ? resolve(answer) : reject(error ?? new Error('no answer')),
    ),
  );
}

/** A ServerLive call (it does nothing); resolves when answered, whatever the answer. */
export function serverLive(client: grpc.Client): Promise<void> {
  return new Promise((resolve) =>
    client.makeUnaryRequest(
      SERVER_LIVE_PATH,
      identity,
      identity,
      Buffer.alloc(0),
      { deadline: Date.now() + 30_000 },
      () => resolve(),
    ),
  );
}

/** A ServerLive call on `client` every `everyMs` until stopped; stop() gives the latencies (ms) of those answered. */
export function serverLiveEvery(client: grpc.Client, everyMs: number): { stop(): number[] } {
  const latencies: number[] = [];
  const timer = setInterval(() => {
    const t = performance.now();
    void serverLive(client).then(() => latencies.push(performance.now() - t));
  }, everyMs);
  return {
    stop: () => {
      clearInterval(timer);
      return latencies;
    },
  };
}
