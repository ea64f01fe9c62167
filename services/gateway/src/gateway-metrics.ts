import { Injectable } from '@nestjs/common';
import { Metrics } from '@infermesh/telemetry';
import type { Counter, Histogram } from 'prom-client';

export type Protocol = 'rest' | 'grpc';

/**
 * The gateway's own metrics. Labels stay bounded: endpoints are route templates or RPC names, never
 * raw paths; models are named only once the registry or router knew them.
 */
@Injectable()
export class GatewayMetrics {
  private readonly requestSeconds: Histogram<'protocol' | 'endpoint' | 'code'>;
  private readonly inferences: Counter<'model' | 'version' | 'outcome'>;

  constructor(metrics: Metrics) {
    this.requestSeconds = metrics.histogram(
      'request_duration_seconds',
      'Duration of public API requests, by protocol, endpoint (route template or RPC) and status code.',
      ['protocol', 'endpoint', 'code'],
    );
    this.inferences = metrics.counter(
      'inference_requests_total',
      'Inference requests by model, served version and outcome (ok, cached, degraded or the error code).',
      ['model', 'version', 'outcome'],
    );
  }

  observeRequest(protocol: Protocol, endpoint: string, code: string, startNs: bigint): void {
    this.requestSeconds.observe({ protocol, endpoint, code }, Number(process.hrtime.bigint() - startNs) / 1e9);
  }

  countInference(model: string, version: string, outcome: string): void {
    this.inferences.inc({ model, version, outcome });
  }
}
