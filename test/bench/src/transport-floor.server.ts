import { create } from '@bufbuild/protobuf';
import { tuneHeapForTensors } from '@infermesh/config';
import { GrpcServer, HealthService, type ServiceImpl, Errors, ServingStatus } from '@infermesh/grpc';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { InferenceResponseSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { DataType } from '@infermesh/tensors';

/**
 * The worker benchmark's transport floor, run as a process of its own as the worker is: a
 * WorkerService whose Infer computes nothing. It answers each request with an FP32 output of
 * [batch, OUTPUT_WIDTH] zeros (the MLP's output size), built once per batch size, so a call through
 * it costs what the client, grpc-js, HTTP/2 and protobuf cost for the MLP's bytes, and nothing else.
 * It runs with the worker's V8 and C library settings (tuneHeapForTensors, and WORKER_MALLOC_ENV
 * from the parent), and answers grpc.health.v1 Check as every service does: the reference for the
 * worker's health-check latency. Prints nothing; sends its port to the parent over IPC.
 */
const OUTPUT_WIDTH = 512;
const outputs = new Map<number, Uint8Array>();

const refuse = () => {
  throw Errors.invalidRequest('the transport-floor server answers Infer only');
};
const impl: Omit<ServiceImpl<typeof WorkerService>, 'infers'> = {
  infer: async ({ request }) => {
    const batch = Number(request?.inputs[0]?.shape[0] ?? 1n);
    let data = outputs.get(batch);
    if (data === undefined) outputs.set(batch, (data = new Uint8Array(batch * OUTPUT_WIDTH * 4)));
    return {
      response: create(InferenceResponseSchema, {
        modelName: request?.modelName,
        modelVersion: request?.modelVersion,
        outputs: [{ name: 'output', datatype: DataType.FP32, shape: [BigInt(batch), BigInt(OUTPUT_WIDTH)], data }],
      }),
    };
  },
  listModels: refuse,
  loadModel: refuse,
  unloadModel: refuse,
};

async function main(): Promise<void> {
  tuneHeapForTensors();
  const server = new GrpcServer({
    logger: new JsonLogger('transport-floor', 'error', () => undefined),
    metrics: new Metrics('transport_floor'),
    maxMessageBytes: 64 << 20,
  });
  server.add(WorkerService, impl, { infers: 'infer' });
  const health = new HealthService();
  health.setAll(ServingStatus.SERVING);
  server.add(Health, health);
  const port = await server.listen('127.0.0.1', 0);
  process.send?.({ port });
  process.on('disconnect', () => void server.shutdown(0).then(() => process.exit(0)));
}

void main();
