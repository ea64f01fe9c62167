import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { create } from '@bufbuild/protobuf';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  type InferenceRequest,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { versionName } from '@infermesh/rollout';
import { checkInputs } from '@infermesh/tensors';
import { Metrics, requestContext, spans } from '@infermesh/telemetry';
import type { Counter, Gauge, Histogram } from 'prom-client';
import { ModelLifecycle } from './model-lifecycle';
import type { RunResult } from './model-runtime';
import { ModelTable, type WorkerModel } from './model-table';
import { assertPlaced } from './model-placement';
import { ModelSync } from './model-sync';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

const COMPUTE_BUCKETS_SECONDS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/**
 * Runs inference requests on the model versions this worker knows. A version that is registered but
 * not loaded (never yet, or evicted) is loaded on the request's behalf, one load for every request
 * that waits for it, for at most WORKER_LOAD_TIMEOUT_MS and never past the request's deadline. A
 * model outside the worker's placement (WORKER_MODELS) is refused with FAILED_PRECONDITION.
 */
@Injectable()
export class InferenceExecutor {
  private readonly computeSeconds: Histogram<'model' | 'version' | 'device'>;
  private readonly batchSizes: Histogram<'model' | 'version'>;
  private readonly failures: Counter<'reason'>;
  private readonly inFlight: Gauge;
  private draining = false;

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly table: ModelTable,
    private readonly lifecycle: ModelLifecycle,
    private readonly sync: ModelSync,
    private readonly metrics: Metrics,
    private readonly clock: Clock,
  ) {
    this.computeSeconds = metrics.histogram(
      'inference_compute_seconds',
      'Time a model version computes one request on its execution instance, by execution provider (device).',
      ['model', 'version', 'device'],
      COMPUTE_BUCKETS_SECONDS,
      { exemplars: true },
    );
    this.batchSizes = metrics.histogram(
      'inference_batch_size',
      'Batch size (first dimension) of the requests a model version runs.',
      ['model', 'version'],
      BATCH_BUCKETS,
    );
    this.failures = metrics.counter('inference_failures_total', 'Requests refused or failed, by ErrorInfo reason.', [
      'reason',
    ]);
    this.inFlight = metrics.gauge(
      'inference_requests_in_flight',
      'Requests the worker is handling now, loading their model included.',
    );
  }

  /** From now on new requests are refused with UNAVAILABLE; those already running finish. */
  drain(): void {
    this.draining = true;
  }

  async infer(request: InferenceRequest, deadlineMs?: number): Promise<InferenceResponse> {
    this.inFlight.inc();
    try {
      return await this.run(request, deadlineMs);
    } catch (error) {
      this.failures.inc({ reason: error instanceof RpcError ? (error.reason ?? 'UNKNOWN') : 'INTERNAL' });
      throw error;
    } finally {
      this.inFlight.dec();
    }
  }

  private async run(request: InferenceRequest, deadlineMs: number | undefined): Promise<InferenceResponse> {
    if (this.draining) throw Errors.workerDraining('the worker is shutting down; send the request to another worker');
    const { modelName: model, modelVersion: version } = request;
    if (model === '') throw Errors.invalidRequest('the request names no model');
    if (version === '')
      throw Errors.invalidRequest(`the request for model "${model}" carries no resolved model version`);
    assertPlaced(this.config, model, version);
    const name = versionName(model, version);
    const entry = this.table.get(name) ?? (await this.sync.lookup(name));
    if (entry === undefined) {
      throw Errors.modelNotFound(
        this.table.hasModel(model)
          ? `version ${version} of model "${model}" is not registered for this worker`
          : `model "${model}" is not registered for this worker`,
        { metadata: { model, version } },
      );
    }
    await this.loaded(entry, deadlineMs);
    return entry.use(async (session) => {
      const problem = checkInputs(model, session.inputs, request.inputs, entry.maxBatchSize);
      if (problem !== undefined) throw Errors.invalidTensor(problem, { metadata: { model, version } });
      if (deadlineMs !== undefined && deadlineMs <= this.clock.now()) {
        throw Errors.deadlineExceeded('the request deadline passed before the model ran');
      }
      const batch = Number(request.inputs[0]?.shape[0] ?? 1n);
      const { processing } = entry;
      processing.checkClassCounts(request.outputClassCounts);
      const feeds = processing.preprocess(request.inputs);
      const span = spans.child('onnxruntime run', requestContext.current()?.span, {
        'infermesh.model': model,
        'infermesh.model.version': version,
        'infermesh.batch.size': batch,
        'infermesh.execution_provider': session.executionProvider,
      });
      let run: RunResult;
      try {
        run = await session.run(feeds, request.outputNames);
      } catch (error) {
        spans.end(span, error);
        throw error;
      }
      span?.setAttribute('infermesh.instance', run.instance);
      spans.end(span);
      const { outputs: raw, computeMs } = run;
      const outputs = processing.postprocess(raw, request.outputClassCounts);
      this.metrics.observe(
        this.computeSeconds,
        { model, version, device: session.executionProvider },
        computeMs / 1000,
      );
      if (entry.maxBatchSize > 0) this.batchSizes.observe({ model, version }, batch);
      return create(InferenceResponseSchema, { modelName: model, modelVersion: version, id: request.id, outputs });
    });
  }

  /** Returns with the entry READY (loading it if need be), synchronously before the caller uses it. */
  private async loaded(entry: WorkerModel, deadlineMs: number | undefined): Promise<void> {
    const loadDeadline = Math.min(this.clock.now() + this.config.loadTimeoutMs, deadlineMs ?? Infinity);
    while (entry.state !== ModelState.READY) {
      const remaining = loadDeadline - this.clock.now();
      if (remaining <= 0) throw this.loadTimedOut(entry, deadlineMs);
      let cancel = (): void => undefined;
      const timedOut = new Promise<'timeout'>(
        (resolve) => (cancel = this.clock.setTimer(() => resolve('timeout'), remaining)),
      );
      try {
        if ((await Promise.race([this.lifecycle.ensureLoaded(entry), timedOut])) === 'timeout')
          throw this.loadTimedOut(entry, deadlineMs);
      } finally {
        cancel();
      }
    }
  }

  private loadTimedOut(entry: WorkerModel, deadlineMs: number | undefined): RpcError {
    if (deadlineMs !== undefined && deadlineMs <= this.clock.now() + 1) {
      return Errors.deadlineExceeded(
        `the request deadline passed while version ${entry.version} of model "${entry.model}" was loading`,
      );
    }
    return Errors.modelNotReady(
      `version ${entry.version} of model "${entry.model}" is still loading after ${this.config.loadTimeoutMs} ms (WORKER_LOAD_TIMEOUT_MS)`,
      { metadata: { model: entry.model, version: entry.version } },
    );
  }
}
