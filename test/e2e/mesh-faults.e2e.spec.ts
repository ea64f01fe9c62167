import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import { type Fixture, inferTinyDistinct, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

/** Attempts the router → batcher edge makes in this test's policy: at most 4 in a row land on the faulty batcher's 10 %. */
const ATTEMPTS = 4;
const RATE_PER_S = 100;
const SECONDS = 30;

/**
 * The shipped policy, with the batchers labelled track=next failing 10 % of the calls they receive
 * (UNAVAILABLE, injected where calls arrive) and the router → batcher edge retrying UNAVAILABLE.
 */
function faultyPolicy(): string {
  const doc = parseDocument(readFileSync(join(REPO_ROOT, 'envoy', 'mesh.yaml'), 'utf8'));
  doc.setIn(
    ['services', 'batcher', 'inboundFault'],
    doc.createNode({ subset: 'next', abort: { grpcStatus: 'UNAVAILABLE', percent: 10 } }),
  );
  const edges = doc.toJSON() as { edges: { from: unknown; to: string }[] };
  const edge = edges.edges.findIndex((e) => e.from === 'router' && e.to === 'batcher');
  if (edge < 0) throw new Error('envoy/mesh.yaml has no router -> batcher edge');
  doc.setIn(['edges', edge, 'retry'], doc.createNode({ attempts: ATTEMPTS }));
  return doc.toString();
}

/**
 * One of two batchers fails 10 % of its calls through the policy's fault injection, under a steady
 * 100 requests/s. Only the mesh retries (the router's own retries are off): the router's xDS client
 * retries each injected UNAVAILABLE on the edge's policy, and no client sees a failure.
 */
describe('one of two batchers failing 10 % of its calls by fault injection', () => {
  let fixture: Fixture;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mesh-faults-'));
    writeFileSync(join(dir, 'mesh.yaml'), faultyPolicy());
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: join(dir, 'mesh.yaml'),
      replicas: {
        batcher: [
          { env: { INFERMESH_INSTANCE_LABELS: 'track=stable' } },
          { env: { INFERMESH_INSTANCE_LABELS: 'track=next' } },
        ],
      },
      env: { ROUTER_RETRY_ATTEMPTS: '0', ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Infer calls each batcher took in, whatever their end, and the faults it injected. */
  const batcherCounts = async () => {
    const of = async (i: number) => ({
      received: await metricValue(
        fixture.system.instanceMetricsUrl('batcher', i),
        'infermesh_batcher_grpc_server_handling_seconds_count',
        { method: 'BatcherService/Infer' },
      ),
      injected: await metricValue(
        fixture.system.instanceMetricsUrl('batcher', i),
        'infermesh_batcher_grpc_server_injected_faults_total',
        { method: 'BatcherService/Infer', fault: 'abort' },
      ),
    });
    return {
      stable: await of(0),
      next: await of(1),
      router: await metricValue(fixture.system.metricsUrl('router'), 'infermesh_router_requests_total', {
        model: 'tiny',
      }),
    };
  };

  it(`loses no request at ${RATE_PER_S} requests/s for ${SECONDS} s; every injected fault is retried, within the retry budget`, async () => {
    const before = await batcherCounts();
    const requests: Promise<number>[] = [];
    const start = performance.now();
    for (let i = 0; i < RATE_PER_S * SECONDS; i++) {
      const due = start + (i * 1000) / RATE_PER_S;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      requests.push(inferTinyDistinct(fixture.system.gatewayUrl));
    }
    const statuses = await Promise.all(requests);
    const seconds = (performance.now() - start) / 1000;
    const after = await batcherCounts();

    const failed = statuses.filter((s) => s !== 200);
    const injected = after.next.injected - before.next.injected;
    // A call the faulty batcher failed never reached its handler: every call that did, on either
    // batcher, answered one request, so the calls beyond the requests are the retries.
    const handled = after.stable.received - before.stable.received + (after.next.received - before.next.received);
    const retries = handled + injected - statuses.length;
    const nextShare = (after.next.received - before.next.received + injected) / (handled + injected);
    console.log(
      `fault injection: ${statuses.length} requests in ${seconds.toFixed(1)} s (${(statuses.length / seconds).toFixed(0)}/s), ${failed.length} failed; ` +
        `the next batcher took ${(nextShare * 100).toFixed(1)} % of the calls and failed ${injected} on purpose ` +
        `(${((injected / (after.next.received - before.next.received + injected)) * 100).toFixed(1)} % of its calls); ` +
        `${retries} retries in the mesh (${((retries / statuses.length) * 100).toFixed(1)} % of requests; budget 20 %); ` +
        `the router took ${after.router - before.router} requests`,
    );
    expect(failed).toEqual([]);
    expect(injected).toBeGreaterThan(0);
    expect(after.stable.injected - before.stable.injected).toBe(0);
    expect(retries).toBe(injected);
    // The router → batcher edge retried them all: the gateway → router edge (which retries UNAVAILABLE too) had nothing to retry.
    expect(after.router - before.router).toBe(statuses.length);
    expect(retries / statuses.length).toBeLessThanOrEqual(0.2);
  }, 120_000);
});
