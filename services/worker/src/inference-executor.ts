import { Injectable } from '@nestjs/common';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  type InferenceRequest,
  type InferenceResponse,
  InferenceResponseSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { checkInputs } from '@infermesh/tensors';
import { Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { ModelTable, versionName } from './model-table';

/** Runs inference requests on the model versions this worker holds. */
@Injectable()
export class InferenceExecutor {
  private readonly durations: Histogram<'model' | 'version'>;
  private readonly failures: Counter<'reason'>;

  constructor(
    private readonly table: ModelTable,
    metrics: Metrics,
  ) {
    this.durations = metrics.histogram('inference_duration_seconds', 'Time a model version takes to run one request.', [
      'model',
      'version',
    ]);
    this.failures = metrics.counter('inference_failures_total', 'Requests refused or failed, by ErrorInfo reason.', ['reason']);
  }

  async infer(request: InferenceRequest, deadlineMs?: number): Promise<InferenceResponse> {
    try {
      return await this.run(request, deadlineMs);
    } catch (error) {
      this.failures.inc({ reason: error instanceof RpcError ? (error.reason ?? 'UNKNOWN') : 'INTERNAL' });
      throw error;
    }
  }

  private async run(request: InferenceRequest, deadlineMs: number | undefined): Promise<InferenceResponse> {
    const { modelName: model, modelVersion: version } = request;
    if (model === '') throw RpcError.invalidArgument('the request names no model');
    if (version === '') throw RpcError.invalidArgument(`the request for model "${model}" carries no resolved model version`);
    const entry = this.table.get(versionName(model, version));
    if (entry === undefined) {
      throw RpcError.notFound(
        this.table.hasModel(model)
          ? `version ${version} of model "${model}" is not loaded on this worker`
          : `model "${model}" is not loaded on this worker`,
        'MODEL_NOT_FOUND',
        { model, version },
      );
    }
    if (entry.state !== ModelState.READY) {
      const detail = entry.state === ModelState.FAILED ? `failed to load: ${entry.reason}` : 'is still loading';
      throw new RpcError(status.UNAVAILABLE, `version ${version} of model "${model}" ${detail}`, {
        reason: 'MODEL_NOT_READY',
        metadata: { model, version },
      });
    }
    return entry.use(async (session) => {
      const problem = checkInputs(model, session.inputs, request.inputs, entry.maxBatchSize);
      if (problem !== undefined) throw RpcError.invalidArgument(problem, 'INVALID_TENSOR', { model, version });
      if (deadlineMs !== undefined && deadlineMs <= Date.now()) {
        throw new RpcError(status.DEADLINE_EXCEEDED, 'the request deadline passed before the model ran', { reason: 'DEADLINE_EXCEEDED' });
      }
      const end = this.durations.startTimer({ model, version });
      const outputs = await session.run(request.inputs, request.outputNames);
      end();
      return create(InferenceResponseSchema, { modelName: model, modelVersion: version, id: request.id, outputs });
    });
  }
}
