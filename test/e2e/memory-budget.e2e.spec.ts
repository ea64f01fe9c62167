import { buildPaddedModel } from '@infermesh/model-builder';
import { API_KEY, type Fixture, metricValue, startFixture } from './support/system-fixture';

const MiB = 2 ** 20;
const MODELS = [1, 2, 3].map((seed) => buildPaddedModel(48 * MiB, seed, `m${seed}`));

/**
 * A worker whose memory budget (120 MiB) fits two of the three 48 MiB models: requests for all
 * three, in turn, through the gateway, all succeed; the worker evicts the least recently used model
 * to load the one asked for, and its metrics count the evictions.
 */
describe('memory budget and eviction', () => {
  let fixture: Fixture;
  beforeAll(async () => {
    // Without the result cache every request reaches the worker.
    fixture = await startFixture({
      models: MODELS,
      env: { WORKER_MEMORY_BUDGET_BYTES: '120MiB', ROUTER_CACHE_ENABLED: 'false' },
    });
  });
  afterAll(async () => {
    await fixture?.stop();
  });

  const infer = (model: string, value: number) =>
    fetch(`${fixture.system.gatewayUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
      body: JSON.stringify({ inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4], data: [value, 0, 0, 0] }] }),
    });

  it('serves three models in turn with room for two, evicting as it goes, with no failed request', async () => {
    const workerMetrics = fixture.system.metricsUrl('worker');
    const evictionsBefore = await metricValue(workerMetrics, 'infermesh_worker_model_evictions_total');
    const statuses: number[] = [];
    for (let round = 0; round < 3; round++) {
      for (const { name } of MODELS) {
        const response = await infer(name, round + 1);
        statuses.push(response.status);
        const body = (await response.json()) as { model_name: string; outputs: { data: number[] }[] };
        expect(body.model_name).toBe(name);
        // input [x, 0, 0, 0] · W + b, first row of the tiny model's weights: [x + 0.1, -0.2, 0.5x + 0.3]
        expect(body.outputs[0]!.data[0]).toBeCloseTo(round + 1.1, 5);
      }
    }
    expect(statuses).toEqual(new Array(9).fill(200));
    const evictions = (await metricValue(workerMetrics, 'infermesh_worker_model_evictions_total')) - evictionsBefore;
    // Each request after the first two found its model evicted: room for two, three in rotation.
    expect(evictions).toBeGreaterThanOrEqual(7);
    expect(await metricValue(workerMetrics, 'infermesh_worker_models_loaded')).toBe(2);
    expect(await metricValue(workerMetrics, 'infermesh_worker_models_loaded_bytes')).toBeLessThanOrEqual(120 * MiB);
    expect(
      await metricValue(workerMetrics, 'infermesh_worker_model_unloads_total', { reason: 'evicted' }),
    ).toBeGreaterThanOrEqual(evictions);
  });
});
