import { Metrics, requestContext } from '@infermesh/telemetry';
import { ManualClock } from '@infermesh/testing';
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

  it('records how long a request took with the span of the request it runs in as exemplar', async () => {
    const metrics = new Metrics('gateway');
    const clock = new ManualClock();
    const sut = new GatewayMetrics(metrics, clock);

    await requestContext.run({ requestId: 'r', span: span('00f067aa0ba902b7') }, async () => {
      const timer = sut.startRequest('grpc');
      clock.advance(250);
      timer.end('ModelInfer', 'OK');
    });

    const text = await metrics.render('openmetrics');
    expect(text).toContain(`${HISTOGRAM}_count{protocol="grpc",endpoint="ModelInfer",code="OK"} 1\n`);
    expect(text).toContain(`${HISTOGRAM}_sum{protocol="grpc",endpoint="ModelInfer",code="OK"} 0.25\n`);
    expect(exemplarSpanIds(text)).toEqual(['00f067aa0ba902b7']);
  });

  it('takes the span it is given when it records after the request context is gone (a REST response closing)', async () => {
    const metrics = new Metrics('gateway');
    const sut = new GatewayMetrics(metrics, new ManualClock());

    sut.startRequest('rest').end('POST /v2/models/:model/infer', '200', span('53995c3f42cd8ad8'));
    sut.startRequest('rest').end('unmatched', '404');

    const text = await metrics.render('openmetrics');
    expect(text).toContain(`${HISTOGRAM}_count{protocol="rest",endpoint="unmatched",code="404"} 1\n`);
    expect(exemplarSpanIds(text)).toEqual(['53995c3f42cd8ad8']);
    expect(await metrics.render('prometheus')).toContain(
      `${HISTOGRAM}_count{protocol="rest",endpoint="POST /v2/models/:model/infer",code="200"} 1\n`,
    );
  });
});
