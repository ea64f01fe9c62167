import { trace, TraceFlags } from '@opentelemetry/api';
import { Gauge } from 'prom-client';
import { LATENCY_BUCKETS_SECONDS, Metrics } from './metrics';
import { requestContext } from './request-context';

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const sampled = trace.wrapSpanContext({
  traceId: TRACE_ID,
  spanId: '00f067aa0ba902b7',
  traceFlags: TraceFlags.SAMPLED,
});
const unsampled = trace.wrapSpanContext({ traceId: TRACE_ID, spanId: '53995c3f42cd8ad8', traceFlags: TraceFlags.NONE });

/** The lines of a histogram's buckets that carry an exemplar. */
function exemplarLines(text: string, name: string): string[] {
  return text.split('\n').filter((line) => line.startsWith(`${name}_bucket`) && line.includes(' # {'));
}

/**
 * The OpenMetrics text format's rules that Prometheus' parser enforces and the Prometheus format
 * does not have: no blank line, `# EOF` last, a counter family named without `_total` and its
 * samples with it, exemplars only on buckets, and each sample line well formed.
 */
function openMetricsViolations(text: string): string[] {
  const violations: string[] = [];
  if (!text.endsWith('\n# EOF\n')) violations.push('does not end in # EOF');
  const families = new Map<string, string>();
  let family: { name: string; type: string } | undefined;
  for (const line of text.slice(0, -'# EOF\n'.length).split('\n').slice(0, -1)) {
    const type = /^# TYPE (\S+) (counter|gauge|histogram|summary|unknown)$/.exec(line);
    if (type !== null) {
      family = { name: type[1]!, type: type[2]! };
      if (families.has(family.name)) violations.push(`family ${family.name} twice`);
      families.set(family.name, family.type);
      if (family.type === 'counter' && family.name.endsWith('_total'))
        violations.push(`counter family ${family.name} named with _total`);
      continue;
    }
    if (/^# HELP \S+ .*$/.test(line)) continue;
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)( # \{[^}]*\} \S+ \S+)?$/.exec(line);
    if (sample === null || family === undefined) {
      violations.push(`not a sample line: ${JSON.stringify(line)}`);
      continue;
    }
    const [, name, , value, exemplar] = sample;
    const suffixes = {
      counter: ['_total'],
      gauge: [''],
      histogram: ['_bucket', '_sum', '_count'],
      summary: ['', '_sum', '_count'],
      unknown: [''],
    }[family.type]!;
    if (!suffixes.some((suffix) => name === family!.name + suffix))
      violations.push(`${name} in the ${family.type} family ${family.name}`);
    if (Number.isNaN(Number(value)) && !/^(NaN|Nan|[+-]Inf)$/.test(value!))
      violations.push(`${name} has the value ${value}`);
    if (exemplar !== undefined && !name!.endsWith('_bucket')) violations.push(`exemplar on ${name}`);
  }
  return violations;
}

describe(Metrics.name, () => {
  it('names every metric of its own infermesh_<service>_<name>, and the default process metrics by their standard names with a service label', async () => {
    const sut = new Metrics('router');
    sut.counter('requests_total', 'Requests.', ['outcome']).inc({ outcome: 'hit' }, 3);
    sut.gauge('inflight', 'In flight.').set(2);
    sut.histogram('latency_seconds', 'Latency.').observe(0.003);

    const text = await sut.render();

    expect(text).toContain('infermesh_router_requests_total{outcome="hit"} 3');
    expect(text).toContain('infermesh_router_inflight 2');
    expect(text).toContain('infermesh_router_latency_seconds_count 1');
    const samples = expectStandardMetricsOf('router', text);
    expect(samples.filter((line) => !/^(process|nodejs)_/.test(line) && !line.startsWith('infermesh_router_'))).toEqual(
      [],
    );
  });

  it('uses latency buckets from 100 µs to 10 s unless told otherwise', async () => {
    const sut = new Metrics('worker');
    sut.histogram('default_seconds', 'Default.').observe(0.00005);
    sut.histogram('custom_seconds', 'Custom.', [], [1, 2]).observe(1.5);

    const text = await sut.render();

    for (const bucket of LATENCY_BUCKETS_SECONDS)
      expect(text).toContain(`infermesh_worker_default_seconds_bucket{le="${bucket}"} 1`);
    expect(text).toContain('infermesh_worker_custom_seconds_bucket{le="1"} 0');
    expect(text).toContain('infermesh_worker_custom_seconds_bucket{le="2"} 1');
    expect(text).not.toContain('infermesh_worker_custom_seconds_bucket{le="0.0001"}');
  });

  it('keeps each instance in its own registry', async () => {
    const one = new Metrics('svc');
    const two = new Metrics('svc');
    one.counter('calls_total', 'Calls.').inc();
    two.counter('calls_total', 'Calls.').inc(5);

    expect(await one.render()).toContain('infermesh_svc_calls_total 1');
    expect(await two.render()).toContain('infermesh_svc_calls_total 5');
  });

  it('renders the same metrics as OpenMetrics: standard default metric names with the service label, counters as _total samples of their family, # EOF last', async () => {
    const sut = new Metrics('router');
    sut.counter('requests_total', 'Requests.', ['outcome']).inc({ outcome: 'hit' }, 3);
    sut.counter('untouched_total', 'Never counted.', ['outcome']);
    sut.gauge('inflight', 'In flight.').set(2);
    sut.gauge('collected', 'Set on scrape.', ['kind'], (gauge) => gauge.set({ kind: 'a"b\\c' }, 7));
    sut.histogram('latency_seconds', 'Latency.', ['model']).observe({ model: 'm' }, 0.003);
    sut.observe(sut.histogram('traced_seconds', 'Traced.', [], [0.1, 1], { exemplars: true }), {}, 5, sampled);

    const text = await sut.render('openmetrics');

    expect(openMetricsViolations(text)).toEqual([]);
    expect(text).toContain(
      '# TYPE infermesh_router_requests counter\ninfermesh_router_requests_total{outcome="hit"} 3\n',
    );
    expect(text).toContain('infermesh_router_collected{kind="a\\"b\\\\c"} 7\n');
    expect(text).toContain('infermesh_router_latency_seconds_count{model="m"} 1\n');
    expect(text).toContain('# TYPE process_cpu_user_seconds counter\n');
    expectStandardMetricsOf('router', text);
  });

  it('keeps the _total of counters in the Prometheus format, also while OpenMetrics scrapes run alongside', async () => {
    const sut = new Metrics('router');
    sut.counter('requests_total', 'Requests.').inc(3);

    const [openMetrics, prometheus] = await Promise.all([
      sut.render('openmetrics'),
      sut.render('prometheus'),
      sut.render('openmetrics'),
    ]);
    const after = await sut.render();

    expect(openMetrics).toContain('\ninfermesh_router_requests_total 3\n');
    for (const text of [prometheus, after]) {
      expect(text).toContain('# TYPE infermesh_router_requests_total counter\ninfermesh_router_requests_total 3\n');
      expect(text).toMatch(/^process_cpu_user_seconds_total\{service="router"\} /m);
      expect(text).not.toContain('# EOF');
    }
  });

  it('renders a metric registered on its registry directly in both formats', async () => {
    const sut = new Metrics('registry');
    new Gauge({ name: 'infermesh_registry_models', help: 'Models.', registers: [sut.registry] }).set(4);

    expect(await sut.render('prometheus')).toContain('infermesh_registry_models 4\n');
    expect(await sut.render('openmetrics')).toContain('infermesh_registry_models 4\n');
  });

  it('keeps, per bucket, the trace of the last sampled observation as its exemplar, in OpenMetrics only', async () => {
    const sut = new Metrics('gateway');
    const latency = sut.histogram('request_duration_seconds', 'Duration.', ['code'], [0.01, 0.1, 1], {
      exemplars: true,
    });

    await requestContext.run({ requestId: 'r', span: sampled }, async () => {
      await new Promise((resolve) => setImmediate(resolve)); // a hop through the event loop
      sut.observe(latency, { code: 'OK' }, 0.05);
    });
    sut.observe(latency, { code: 'OK' }, 3, sampled); // an explicit span, outside any request: the +Inf bucket

    const openMetrics = await sut.render('openmetrics');
    const prometheus = await sut.render('prometheus');

    expect(exemplarLines(openMetrics, 'infermesh_gateway_request_duration_seconds')).toEqual([
      expect.stringMatching(
        /^infermesh_gateway_request_duration_seconds_bucket\{le="0\.1",code="OK"\} 1 # \{trace_id="4bf92f3577b34da6a3ce929d0e0e4736",span_id="00f067aa0ba902b7"\} 0\.05 \d+(\.\d+)?$/,
      ),
      expect.stringMatching(
        /^infermesh_gateway_request_duration_seconds_bucket\{le="\+Inf",code="OK"\} 2 # \{trace_id="4bf92f3577b34da6a3ce929d0e0e4736",span_id="00f067aa0ba902b7"\} 3 /,
      ),
    ]);
    expect(prometheus).toContain('infermesh_gateway_request_duration_seconds_bucket{le="0.1",code="OK"} 1\n');
    expect(prometheus).toContain('infermesh_gateway_request_duration_seconds_count{code="OK"} 2\n');
    expect(prometheus).not.toContain('trace_id');
  });

  it('takes no exemplar from an unsampled trace, or outside a trace, and keeps the one it has', async () => {
    const sut = new Metrics('gateway');
    const latency = sut.histogram('request_duration_seconds', 'Duration.', [], [0.1, 1], { exemplars: true });

    requestContext.run({ requestId: 'r', span: unsampled }, () => sut.observe(latency, {}, 0.05));
    requestContext.run({ requestId: 'r' }, () => sut.observe(latency, {}, 0.06));
    sut.observe(latency, {}, 0.07);
    expect(exemplarLines(await sut.render('openmetrics'), 'infermesh_gateway_request_duration_seconds')).toEqual([]);

    sut.observe(latency, {}, 0.08, sampled);
    requestContext.run({ requestId: 'r', span: unsampled }, () => sut.observe(latency, {}, 0.09));
    const text = await sut.render('openmetrics');

    expect(text).toContain('infermesh_gateway_request_duration_seconds_count 5\n');
    expect(exemplarLines(text, 'infermesh_gateway_request_duration_seconds')).toEqual([
      expect.stringContaining('span_id="00f067aa0ba902b7"} 0.08 '),
    ]);
  });

  it('observes a histogram made without exemplars as before, never with one', async () => {
    const sut = new Metrics('router');
    const latency = sut.histogram('request_duration_seconds', 'Duration.', ['model']);

    requestContext.run({ requestId: 'r', span: sampled }, () => sut.observe(latency, { model: 'm' }, 0.05));
    latency.observe({ model: 'm' }, 0.5);
    const text = await sut.render('openmetrics');

    expect(text).toContain('infermesh_router_request_duration_seconds_count{model="m"} 2\n');
    expect(text).not.toContain('trace_id');
  });
});

/** Checks the default process and Node.js metrics keep their standard names, each with the service label; returns the samples. */
function expectStandardMetricsOf(service: string, text: string): string[] {
  expect(text).toMatch(new RegExp(`^process_cpu_user_seconds_total\\{service="${service}"\\} `, 'm'));
  expect(text).toMatch(new RegExp(`^nodejs_heap_size_used_bytes\\{service="${service}"\\} `, 'm'));
  const samples = text.split('\n').filter((line) => line !== '' && !line.startsWith('#'));
  const standard = samples.filter((line) => /^(process|nodejs)_/.test(line));
  expect(standard.length).toBeGreaterThan(0);
  expect(standard.filter((line) => !line.includes(`service="${service}"`))).toEqual([]);
  return samples;
}
