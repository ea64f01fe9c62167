import { parseDocument } from 'yaml';
import { edgeRetryOf, outlierDetectionOf, retries, retryBackoffMs } from './edge-settings';
import { EnvoyApi } from './envoy-api-check';
import { type MeshPolicy, parseMeshPolicy } from './mesh-policy';
import { XDS_TYPE_NAMES, XDS_TYPES, xdsResources } from './xds-resources';
import { policyWith, SHIPPED_POLICY as SHIPPED } from './policy.testing';

describe('edge settings read back from xDS', () => {
  const api = EnvoyApi.load();
  /** The batcher's resources for the worker edge, through the wire and back. */
  function workerEdge(policy: MeshPolicy) {
    const served = xdsResources(policy, 'batcher', 'grpc', []);
    const wire = (typeUrl: typeof XDS_TYPES.listener | typeof XDS_TYPES.cluster) =>
      api.decode(XDS_TYPE_NAMES[typeUrl], api.encode(XDS_TYPE_NAMES[typeUrl], served[typeUrl].get('worker')));
    return { listener: wire(XDS_TYPES.listener), cluster: wire(XDS_TYPES.cluster) };
  }
  const workerEdgeIndex = (policy: MeshPolicy) =>
    policy.edges.findIndex((e) => e.from === 'batcher' && e.to === 'worker');

  it("gives the batcher the policy's retry and outlier detection of the worker edge", () => {
    const policy = policyWith();
    const { listener, cluster } = workerEdge(policy);
    const edge = policy.edges[workerEdgeIndex(policy)]!;
    expect(edgeRetryOf(listener)).toEqual({
      on: edge.retry.on,
      attempts: edge.retry.attempts,
      backoff: { baseMs: edge.retry.backoff.base, maxMs: edge.retry.backoff.max },
      perTryTimeoutMs: undefined,
    });
    expect(outlierDetectionOf(cluster)).toEqual(edge.outlierDetection);
  });

  it('follows a changed policy: more attempts, a per-try timeout, success-rate ejection, no consecutive rules', () => {
    const doc = parseDocument(SHIPPED);
    const at = (doc.toJSON() as { edges: { from: unknown; to: string }[] }).edges.findIndex(
      (e) => e.from === 'batcher' && e.to === 'worker',
    );
    doc.setIn(
      ['edges', at, 'retry'],
      doc.createNode({ attempts: 4, on: ['unavailable', 'internal'], perTryTimeout: '2s' }),
    );
    doc.setIn(
      ['edges', at, 'outlierDetection'],
      doc.createNode({
        consecutiveFailures: 0,
        consecutiveGatewayFailures: 0,
        successRate: { stdevFactor: 1500, minimumHosts: 3, requestVolume: 40 },
      }),
    );
    const policy = parseMeshPolicy(doc.toString());
    const { listener, cluster } = workerEdge(policy);
    expect(edgeRetryOf(listener)).toMatchObject({
      on: ['unavailable', 'internal'],
      attempts: 4,
      perTryTimeoutMs: 2000,
    });
    expect(outlierDetectionOf(cluster)).toMatchObject({
      consecutiveFailures: 0,
      consecutiveGatewayFailures: 0,
      successRate: { stdevFactor: 1500, minimumHosts: 3, requestVolume: 40 },
    });
  });

  it('reads no retry from an edge with one attempt', () => {
    const doc = parseDocument(SHIPPED);
    const at = (doc.toJSON() as { edges: { from: unknown; to: string }[] }).edges.findIndex(
      (e) => e.from === 'batcher' && e.to === 'worker',
    );
    doc.setIn(['edges', at, 'retry'], doc.createNode({ attempts: 1 }));
    expect(edgeRetryOf(workerEdge(parseMeshPolicy(doc.toString())).listener)).toMatchObject({ attempts: 1 });
  });

  it('retries the statuses named, and backs off with full jitter up to the cap', () => {
    const retry = {
      on: ['unavailable'] as const,
      attempts: 3,
      backoff: { baseMs: 10, maxMs: 25 },
      perTryTimeoutMs: undefined,
    };
    expect(retries(retry, 14)).toBe(true);
    expect(retries(retry, 13)).toBe(false);
    expect(retries(retry, 3)).toBe(false);
    expect(retryBackoffMs(retry, 0, () => 1)).toBe(10);
    expect(retryBackoffMs(retry, 1, () => 1)).toBe(20);
    expect(retryBackoffMs(retry, 2, () => 1)).toBe(25);
    expect(retryBackoffMs(retry, 2, () => 0.5)).toBe(12.5);
  });
});
