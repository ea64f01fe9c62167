import { Inject, Injectable } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { create } from '@bufbuild/protobuf';
import { toRpcError } from '@infermesh/grpc';
import {
  type InferenceRequest,
  InferenceRequestSchema,
  type InferenceResponse,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import type { ModelVersion } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { versionIdOf } from '@infermesh/rollout';
import { JsonLogger, Metrics, ModelLabels, requestContext, spans } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';
import { GuardedBatcher } from './guarded-batcher';
import { compareOutputs } from '@infermesh/tensors';
import { ROUTER_CONFIG, type RouterConfig } from './router.config';
import { TrafficReporter } from './traffic-reporter';

type Labels = 'model' | 'primary' | 'shadow';

/**
 * Shadow traffic: a request the rollout mirrors runs again on the shadow version in the background,
 * under its own deadline, after the client has its answer, which it never delays, changes or fails.
 * The shadow's outputs are compared with the served ones and the comparison exported per model,
 * primary and shadow version: top-1 agreement, largest absolute difference, relative L2 distance and
 * the difference in latency. The items compared and agreed also go to the registry, under the shadow
 * version (TrafficReporter), for its automatic rollouts.
 */
@Injectable()
export class ShadowTraffic {
  private readonly requests: Counter<Labels | 'outcome'>;
  private readonly items: Counter<Labels>;
  private readonly agreed: Counter<Labels>;
  private readonly mismatched: Counter<Labels>;
  private readonly maxAbsDiff: Histogram<Labels>;
  private readonly relativeL2: Histogram<Labels>;
  private readonly latencyDiff: Histogram<Labels>;

  constructor(
    private readonly batcher: GuardedBatcher,
    @Inject(ROUTER_CONFIG) private readonly config: RouterConfig,
    private readonly logger: JsonLogger,
    private readonly modelLabels: ModelLabels,
    private readonly traffic: TrafficReporter,
    metrics: Metrics,
    private readonly clock: Clock,
  ) {
    const labels: Labels[] = ['model', 'primary', 'shadow'];
    this.requests = metrics.counter(
      'shadow_requests_total',
      'Requests mirrored to a shadow version, by outcome (ok or the error code).',
      [...labels, 'outcome'],
    );
    this.items = metrics.counter(
      'shadow_compared_items_total',
      'Batch items (or whole outputs) compared between the served and the shadow version.',
      labels,
    );
    this.agreed = metrics.counter(
      'shadow_agreed_items_total',
      'Compared items on which the shadow agreed: the same top class, or the same bits.',
      labels,
    );
    this.mismatched = metrics.counter(
      'shadow_mismatched_outputs_total',
      'Shadow outputs of another shape or datatype than the served ones, or missing.',
      labels,
    );
    const spread = [0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10];
    this.maxAbsDiff = metrics.histogram(
      'shadow_max_abs_diff',
      'Largest absolute difference between served and shadow floating-point outputs, per request.',
      labels,
      spread,
    );
    this.relativeL2 = metrics.histogram(
      'shadow_relative_l2',
      'Relative L2 distance of the shadow outputs from the served ones, per request.',
      labels,
      spread,
    );
    this.latencyDiff = metrics.histogram(
      'shadow_latency_diff_seconds',
      'Shadow latency minus the served latency, per request.',
      labels,
      [-1, -0.1, -0.025, -0.01, -0.005, -0.001, 0, 0.001, 0.005, 0.01, 0.025, 0.1, 1],
    );
  }

  /** Runs the request on the shadow version in the background and compares its answer with `served`. */
  mirror(request: InferenceRequest, shadow: ModelVersion, served: InferenceResponse, servedMs: number): void {
    const model = request.modelName;
    const shadowVersion = versionIdOf(shadow.name);
    const labels = {
      model: this.modelLabels.model(model),
      primary: this.modelLabels.version(model, served.modelVersion),
      shadow: this.modelLabels.version(model, shadowVersion),
    };
    const mirrored = create(InferenceRequestSchema, { ...request, modelVersion: shadowVersion });
    const start = this.clock.monotonic();
    // Traced as a step of the request it mirrors, outliving it.
    const ambient = requestContext.current();
    const span = spans.child('shadow', ambient?.span, {
      'infermesh.model': model,
      'infermesh.model.version': shadowVersion,
      'infermesh.route': 'shadow',
    });
    // Not the client's context: its deadline and cancellation end with its answer.
    void requestContext
      .run(
        {
          requestId: `${ambient?.requestId ?? 'shadow'}-shadow`,
          deadlineMs: this.clock.now() + this.config.shadowTimeoutMs,
          ...(span !== undefined && { span }),
        },
        () => this.batcher.infer(mirrored),
      )
      .then(
        (response) => {
          this.requests.inc({ ...labels, outcome: 'ok' });
          this.latencyDiff.observe(labels, (this.clock.monotonic() - start - servedMs) / 1000);
          const comparison = compareOutputs(served.outputs, response.outputs);
          this.items.inc(labels, comparison.items);
          this.agreed.inc(labels, comparison.agreed);
          this.traffic.shadowCompared(shadow.name, comparison.items, comparison.agreed);
          if (comparison.mismatched > 0) this.mismatched.inc(labels, comparison.mismatched);
          this.maxAbsDiff.observe(labels, comparison.maxAbsDiff);
          this.relativeL2.observe(labels, comparison.relativeL2);
          span?.setAttributes({
            'infermesh.shadow.agreed': comparison.agreed,
            'infermesh.shadow.mismatched': comparison.mismatched,
          });
          spans.end(span);
        },
        (error: unknown) => {
          const rpcError = toRpcError(error);
          spans.end(span, rpcError);
          this.requests.inc({ ...labels, outcome: String(rpcError.code) });
          this.logger.debug('shadow request failed', { model, shadow: shadowVersion, err: rpcError.message });
        },
      );
  }
}
