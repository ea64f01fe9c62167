import { Metrics, requestContext } from '@infermesh/telemetry';
import { trace, TraceFlags } from '@opentelemetry/api';
import { GatewayMetrics } from './gateway-metrics';

const HISTOGRAM = 'infermesh_gateway_request_duration_seconds';

function exemplarSpanIds(text: string): string[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith(`${HISTOGRAM}_bucket`))
    .flatMap((line) => /# \{trace_id="[0-9a-f]{32}",span_id="([0-9a-f]{16})"\}/.exec(line)?.[1] ?? []);
}

describe(GatewayMetrics.name, () => {
  const span = (spanId: string) =>
    trace.wrapSpanContext({ traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId, traceFlags: TraceFlags.SAMPLED });

  it('records a request duration with the span of the request it runs in as exemplar', async () => {
    const metrics = new Metrics('gateway');
    const sut = new GatewayMetrics(metrics);

    await requestContext.run({ requestId: 'r', span: span('00f067aa0ba902b7') }, async () => {
      const start = process.hrtime.bigint();
      await new Promise((resolve) => setTimeout(resolve, 1));
      sut.observeRequest('grpc', 'ModelInfer', 'OK', start);
    });

    const text = await metrics.render('openmetrics');
    expect(text).toContain(`${HISTOGRAM}_count{protocol="grpc",endpoint="ModelInfer",code="OK"} 1\n`);
    expect(exemplarSpanIds(text)).toEqual(['00f067aa0ba902b7']);
  });

  it('takes the span it is given when it records after the request context is gone (a REST response closing)', async () => {
    const metrics = new Metrics('gateway');
    const sut = new GatewayMetrics(metrics);

    sut.observeRequest(
      'rest',
      'POST /v2/models/:model/infer',
      '200',
      process.hrtime.bigint(),
      span('53995c3f42cd8ad8'),
    );
    sut.observeRequest('rest', 'unmatched', '404', process.hrtime.bigint());

    const text = await metrics.render('openmetrics');
    expect(text).toContain(`${HISTOGRAM}_count{protocol="rest",endpoint="unmatched",code="404"} 1\n`);
    expect(exemplarSpanIds(text)).toEqual(['53995c3f42cd8ad8']);
    expect(await metrics.render('prometheus')).toContain(
      `${HISTOGRAM}_count{protocol="rest",endpoint="POST /v2/models/:model/infer",code="200"} 1\n`,
    );
  });
});
