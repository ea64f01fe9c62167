import { Errors } from '@infermesh/grpc';
import { ModelState } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { Metrics } from '@infermesh/telemetry';
import { rpcRejection } from '@infermesh/testing';
import { SchedulerMetrics } from './scheduler-metrics';
import { BatcherHarness, call, rowsRequest } from './testing/batcher-harness';
import { versionName as v } from './testing/fake-worker';

describe(SchedulerMetrics.name, () => {
  let h: BatcherHarness;

  beforeEach(async () => {
    h = await BatcherHarness.open();
    h.workers[0].models.set(v('mlp', '1'), ModelState.READY);
  });

  afterEach(async () => {
    await h.close();
  });

  it('exposes the names, types, labels and help texts that dashboards, alert rules and the e2e tests read', async () => {
    await h.start();
    const registry = h.get(Metrics).registry;

    const batcherMetrics = (await registry.getMetricsAsJSON())
      .filter((m) => m.name.startsWith('infermesh_batcher_') && !m.name.startsWith('infermesh_batcher_registry_watch'))
      .map((m) => ({
        name: m.name,
        type: m.type,
        help: m.help,
        labels: (registry.getSingleMetric(m.name) as unknown as { labelNames: string[] }).labelNames,
      }))
      .sort((a, b) => a.name.localeCompare(b.name));

    expect(batcherMetrics).toEqual([
      {
        name: 'infermesh_batcher_batch_size',
        type: 'histogram',
        help: 'Items per batch sent to workers.',
        labels: ['model', 'version'],
      },
      {
        name: 'infermesh_batcher_dispatch_duration_seconds',
        type: 'histogram',
        help: 'Time from arrival to a worker answer.',
        labels: ['model', 'version'],
      },
      {
        name: 'infermesh_batcher_dispatched_total',
        type: 'counter',
        help: 'Requests answered after a worker ran them, by model, version and outcome.',
        labels: ['model', 'version', 'outcome'],
      },
      {
        name: 'infermesh_batcher_queue_depth',
        type: 'gauge',
        help: 'Requests waiting in the queue of each model version.',
        labels: ['model', 'version'],
      },
      {
        name: 'infermesh_batcher_queue_oldest_age_seconds',
        type: 'gauge',
        help: 'How long the oldest request in the queue of each model version has waited: the autoscaling signal.',
        labels: ['model', 'version'],
      },
      {
        name: 'infermesh_batcher_queue_time_seconds',
        type: 'histogram',
        help: 'Time from arrival until a request leaves the queue in a batch.',
        labels: ['model', 'version'],
      },
      {
        name: 'infermesh_batcher_rejections_total',
        type: 'counter',
        help: 'Requests answered without reaching a worker, by model and reason.',
        labels: ['model', 'reason'],
      },
      {
        name: 'infermesh_batcher_retries_total',
        type: 'counter',
        help: 'Batches sent again to another worker after their worker was unavailable.',
        labels: ['model'],
      },
      {
        name: 'infermesh_batcher_worker_ejections_total',
        type: 'counter',
        help: 'Ejections of workers by the outlier detection of the batcher → worker edge.',
        labels: [],
      },
      {
        name: 'infermesh_batcher_workers_ejected',
        type: 'gauge',
        help: 'Workers ejected now by the outlier detection of the batcher → worker edge.',
        labels: [],
      },
      {
        name: 'infermesh_batcher_workers_reachable',
        type: 'gauge',
        help: 'Workers that answered the last poll.',
        labels: [],
      },
    ]);
    const batchSize = registry.getSingleMetric('infermesh_batcher_batch_size') as unknown as { upperBounds: number[] };
    expect(batchSize.upperBounds).toEqual([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
  });

  it('shows the depth of each version queue and the age of its oldest request, as the clock moves', async () => {
    const [w1] = h.workers;
    const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
    const labels = { model: 'mlp', version: '1' };
    const { blocker, release } = await h.occupy(w1);
    const queued = [sut.enqueue(rowsRequest('q1', 1, 1), call()), sut.enqueue(rowsRequest('q2', 1, 2), call())];
    await h.inflight(3);

    h.clock.advance(250);
    expect(await h.metric('queue_depth', labels)).toBe(2);
    expect(await h.metric('queue_oldest_age_seconds', labels)).toBe(0.25);
    const later = sut.enqueue(rowsRequest('q3', 1, 3), call());
    await h.inflight(4);
    h.clock.advance(250);
    expect(await h.metric('queue_depth', labels)).toBe(3);
    expect(await h.metric('queue_oldest_age_seconds', labels)).toBe(0.5);

    release();
    await Promise.all([blocker, ...queued, later]);
    expect(await h.metric('queue_depth', labels)).toBe(0);
    expect(await h.metric('queue_oldest_age_seconds', labels)).toBe(0);
  });

  it('observes the queue time of each request, the size of each batch and the time to each answer', async () => {
    const [w1] = h.workers;
    const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
    const labels = { model: 'mlp', version: '1' };
    const { blocker, release } = await h.occupy(w1);
    const queued = [sut.enqueue(rowsRequest('q1', 1, 1), call()), sut.enqueue(rowsRequest('q2', 3, 2), call())];
    await h.inflight(3);

    // The blocker left the queue at once; the two behind it leave together after 40 ms, as it is answered.
    h.clock.advance(40);
    release();
    await Promise.all([blocker, ...queued]);

    expect(await h.histogram('queue_time_seconds', labels)).toEqual({ count: 3, sum: expect.closeTo(0.08) });
    expect(await h.histogram('batch_size', labels)).toEqual({ count: 2, sum: 5 });
    expect(await h.histogram('dispatch_duration_seconds', labels)).toEqual({ count: 3, sum: expect.closeTo(0.12) });
    expect(await h.metric('dispatched_total', { ...labels, outcome: 'ok' })).toBe(3);
    expect(await h.metric('dispatched_total', { ...labels, outcome: 'error' })).toBe(0);
  });

  it('counts each request of a failed batch as dispatched with outcome error', async () => {
    const [w1] = h.workers;
    const sut = await h.start({ BATCHER_MAX_BATCHES_PER_WORKER: '1' });
    const { blocker, release } = await h.occupy(w1);
    w1.failWith = Errors.internal('the session failed');
    const failed = [1, 2].map((i) => rpcRejection(sut.enqueue(rowsRequest(`q${i}`, 1, i), call())));
    await h.inflight(3);

    release();
    await rpcRejection(blocker);
    await Promise.all(failed);

    expect(await h.metric('dispatched_total', { model: 'mlp', version: '1', outcome: 'error' })).toBe(3);
    expect(await h.histogram('dispatch_duration_seconds')).toEqual({ count: 0, sum: 0 });
  });

  it('labels a model that neither the registry watch nor any worker knows "(unknown)", so that clients cannot grow the label sets', async () => {
    const sut = await h.start();

    for (const model of ['no-such-model', 'another-one']) {
      await rpcRejection(sut.enqueue(rowsRequest('a', 1, 0, { modelName: model }), call()));
    }

    expect(await h.metric('rejections_total', { model: '(unknown)', reason: 'MODEL_NOT_READY' })).toBe(2);
    expect(await h.metric('rejections_total', { model: 'no-such-model' })).toBe(0);
  });
});
