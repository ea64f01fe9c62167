import { LATENCY_BUCKETS_SECONDS, Metrics } from './metrics';

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
    expect(text).toMatch(/^process_cpu_user_seconds_total\{service="router"\} /m);
    expect(text).toMatch(/^nodejs_heap_size_used_bytes\{service="router"\} /m);
    const samples = text.split('\n').filter((line) => line !== '' && !line.startsWith('#'));
    const standard = samples.filter((line) => /^(process|nodejs)_/.test(line));
    expect(standard.length).toBeGreaterThan(0);
    expect(standard.filter((line) => !line.includes('service="router"'))).toEqual([]);
    expect(samples.filter((line) => !/^(process|nodejs)_/.test(line) && !line.startsWith('infermesh_router_'))).toEqual([]);
  });

  it('uses latency buckets from 100 µs to 10 s unless told otherwise', async () => {
    const sut = new Metrics('worker');
    sut.histogram('default_seconds', 'Default.').observe(0.00005);
    sut.histogram('custom_seconds', 'Custom.', [], [1, 2]).observe(1.5);

    const text = await sut.render();

    for (const bucket of LATENCY_BUCKETS_SECONDS) expect(text).toContain(`infermesh_worker_default_seconds_bucket{le="${bucket}"} 1`);
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
});
