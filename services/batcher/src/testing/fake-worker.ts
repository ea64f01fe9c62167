import { Errors, GrpcServer, type RpcError, type ServiceImpl } from '@infermesh/grpc';
import type { InferenceRequest } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type ModelState, WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Histogram } from 'prom-client';

/** Its server's call durations, as Metrics('fake_worker') names them. */
const HANDLING = 'infermesh_fake_worker_grpc_server_handling_seconds';

/** `models/{model}/versions/{version}`. */
export const versionName = (model: string, version: string) => `models/${model}/versions/${version}`;

/**
 * A worker served by the real GrpcServer over a real socket (Infer, and Infers carrying its calls): it lists the versions it is told to, and
 * echoes its input "x" as output "y" (row by row, so that a wrong split shows).
 */
export class FakeWorker {
  /** Resource name -> state reported by ListModels. */
  readonly models = new Map<string, ModelState>();
  /** The models it says it serves (its WORKER_MODELS); empty: every model. */
  placement: string[] = [];
  readonly received: InferenceRequest[] = [];
  listCalls = 0;
  /** Thrown by Infer when set. */
  failWith: RpcError | undefined;
  /** While set, Infer waits for it before answering. */
  hold: Promise<void> | undefined;
  /** Changes the echo, to return a broken batch. */
  mangle: ((response: { outputs: { shape: bigint[] }[] }) => void) | undefined;
  address = '';
  /** Its server's metrics: calls handled by method (grpc_server_handling_seconds). */
  readonly metrics = new Metrics('fake_worker');
  private server: GrpcServer | undefined;

  constructor(readonly id: string) {}

  async start(): Promise<this> {
    const impl: Omit<ServiceImpl<typeof WorkerService>, 'infers'> = {
      listModels: async () => {
        this.listCalls += 1;
        return {
          workerId: this.id,
          models: [...this.models].map(([name, state]) => ({ name, state })),
          placedModels: this.placement,
        };
      },
      infer: async ({ request }) => {
        const req = request!;
        this.received.push(req);
        if (this.hold) await this.hold;
        if (this.failWith) throw this.failWith;
        const x = req.inputs.find((i) => i.name === 'x');
        const response = {
          modelName: req.modelName,
          modelVersion: req.modelVersion,
          id: req.id,
          outputs: x === undefined ? [] : [{ name: 'y', datatype: x.datatype, shape: x.shape, data: x.data }],
        };
        this.mangle?.(response);
        return { response };
      },
      loadModel: () => Promise.reject(Errors.invalidRequest('the batcher never loads models explicitly')),
      unloadModel: () => Promise.reject(Errors.invalidRequest('the batcher never unloads models')),
    };
    this.server = new GrpcServer({
      logger: new JsonLogger(this.id, 'error', () => undefined),
      metrics: this.metrics,
      maxMessageBytes: 1 << 20,
    });
    // As a worker does: Infers carries Infer's calls, as the batcher sends them.
    this.server.add(WorkerService, impl, { infers: 'infer' });
    this.address = `127.0.0.1:${await this.server.listen('127.0.0.1', 0)}`;
    return this;
  }

  /** Calls its server handled, of `method` (e.g. WorkerService/Infer), whatever their end; a stream counts when it ends. */
  async handled(method: string): Promise<number> {
    const { values } = await (this.metrics.registry.getSingleMetric(HANDLING) as Histogram).get();
    return values
      .filter((m) => m.metricName === `${HANDLING}_count` && m.labels['method'] === method)
      .reduce((sum, m) => sum + m.value, 0);
  }

  /** Batches it received, as the number of items in each. */
  batchSizes(): number[] {
    return this.received.map((r) => Number(r.inputs[0]?.shape[0] ?? 0));
  }

  async stop(): Promise<void> {
    await this.server?.shutdown(10);
    this.server = undefined;
  }
}
