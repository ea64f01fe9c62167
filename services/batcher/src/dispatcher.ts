import { Injectable } from '@nestjs/common';
import { status } from '@grpc/grpc-js';
import { RpcError, toRpcError } from '@infermesh/grpc';
import type { InferenceRequest, InferenceResponse } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { WorkerPool } from './worker-pool';

/**
 * Sends each request to a worker that has its model version ready, least outstanding work first.
 * When a worker cannot be reached the request is tried once more on another one that holds the
 * version. (Dynamic batching builds on this: a later issue queues requests per version here.)
 */
@Injectable()
export class Dispatcher {
  private readonly dispatched: Counter<'model' | 'version' | 'outcome'>;
  private readonly retries: Counter<'model'>;
  private readonly duration: Histogram<'model' | 'version'>;

  constructor(
    private readonly pool: WorkerPool,
    metrics: Metrics,
  ) {
    this.dispatched = metrics.counter('dispatched_total', 'Requests dispatched to workers, by model, version and outcome.', [
      'model',
      'version',
      'outcome',
    ]);
    this.retries = metrics.counter('retries_total', 'Requests retried on another worker after a worker could not be reached.', ['model']);
    this.duration = metrics.histogram('dispatch_duration_seconds', 'Time from arrival to a worker answer.', ['model', 'version']);
  }

  async infer(request: InferenceRequest): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    if (model === '' || version === '') throw RpcError.invalidArgument('the batcher needs a model name and a resolved version');
    const name = `models/${model}/versions/${version}`;
    const start = process.hrtime.bigint();
    const candidates = await this.pool.candidates(name);
    if (candidates.length === 0) {
      this.dispatched.inc({ model, version, outcome: 'no_worker' });
      throw RpcError.unavailable(`no worker has model "${model}" version ${version} ready`, 'MODEL_NOT_READY');
    }
    const untried = [...candidates];
    for (let attempt = 0; ; attempt++) {
      // Chosen right before the call, not when the candidates were listed: requests that resume
      // together (e.g. after one shared poll) must see each other's outstanding work.
      const worker = untried.reduce((best, w) => (w.outstanding < best.outstanding ? w : best));
      untried.splice(untried.indexOf(worker), 1);
      try {
        const response = await worker.infer(request);
        this.dispatched.inc({ model, version, outcome: 'ok' });
        this.duration.observe({ model, version }, Number(process.hrtime.bigint() - start) / 1e9);
        return response;
      } catch (error) {
        const rpcError = toRpcError(error);
        const unavailable = rpcError.code === status.UNAVAILABLE;
        // Without ErrorInfo the worker itself was not reached; with it, the worker refused (e.g. draining).
        if (unavailable && rpcError.reason === undefined) this.pool.markUnreachable(worker);
        if (!unavailable || attempt + 1 >= Math.min(2, candidates.length)) {
          this.dispatched.inc({ model, version, outcome: unavailable ? 'unavailable' : 'error' });
          throw unavailable && rpcError.reason === undefined
            ? RpcError.unavailable(`the worker for model "${model}" version ${version} is unreachable: ${rpcError.message}`)
            : rpcError;
        }
        this.retries.inc({ model });
      }
    }
  }
}
