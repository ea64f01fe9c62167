import * as grpc from '@grpc/grpc-js';
import { eventually, startXdsProbe, type XdsProbe } from '@infermesh/testing';
import { type AdsEvent, AdsServer } from './ads-server';
import { EnvoyApi } from './envoy-api-check';
import { type MeshPolicy, type MeshService } from './mesh-policy';
import { type MeshInstance, xdsResources } from './xds-resources';
import { policyWith } from './policy.testing';

/** The shipped policy with values set at paths. */

const IDENTITY = (value: Buffer) => value;
/** A service that answers with the name of the instance that served it, or fails as told. */
const ECHO: grpc.ServiceDefinition = {
  Who: {
    path: '/test.Echo/Who',
    requestStream: false,
    responseStream: false,
    requestSerialize: IDENTITY,
    requestDeserialize: IDENTITY,
    responseSerialize: IDENTITY,
    responseDeserialize: IDENTITY,
  },
};

interface Backend {
  name: string;
  port: number;
  served: number;
  /** Answer UNAVAILABLE instead of serving. */
  failing: boolean;
  server: grpc.Server;
}

async function startBackend(name: string): Promise<Backend> {
  const server = new grpc.Server();
  const backend: Backend = { name, port: 0, served: 0, failing: false, server };
  server.addService(ECHO, {
    Who: (_call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      if (backend.failing) {
        callback({ code: grpc.status.UNAVAILABLE, details: `${name} is failing` });
        return;
      }
      backend.served += 1;
      callback(null, Buffer.from(name));
    },
  });
  backend.port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, port) =>
      error ? reject(error) : resolve(port),
    ),
  );
  return backend;
}

describe(AdsServer.name, () => {
  let controlPlane: grpc.Server;
  let sut: AdsServer;
  let policy: MeshPolicy;
  let instances: MeshInstance[];
  let events: AdsEvent[];
  /** What the control plane serves each node; tests replace it to serve something the policy cannot say. */
  let serve: (cluster: MeshService, kind: 'envoy' | 'grpc') => ReturnType<typeof xdsResources>;
  let stable: Backend;
  let next: Backend;
  let client: XdsProbe;

  const instance = (backend: Backend, track: string): MeshInstance => ({
    service: 'router',
    id: backend.name,
    address: '127.0.0.1',
    port: backend.port,
    labels: { track },
    healthy: true,
  });

  /** `calls` calls of the gateway's xDS client to `xds:///router`, one after the other: how many each backend answered, and each error. */
  const tally = (calls: number) => client.tally(calls);

  /** Recomputes the resources and waits until the client has answered each response it was sent (ACK or NACK). */
  const refreshed = async () => {
    const before = { ...sut.counters };
    sut.refresh();
    await eventually(
      () =>
        sut.counters.acks + sut.counters.nacks - before.acks - before.nacks >=
        sut.counters.responses - before.responses,
    );
  };

  beforeAll(async () => {
    [stable, next] = await Promise.all([startBackend('stable'), startBackend('next')]);
    instances = [instance(stable, 'stable'), instance(next, 'next')];
    events = [];
    policy = policyWith([['edges', 0, 'split'], [{ subset: 'stable', weight: 100 }]]);
    serve = (cluster, kind) => xdsResources(policy, cluster, kind, instances);
    sut = new AdsServer(
      EnvoyApi.load(),
      (node) => serve(node.cluster as MeshService, node.userAgentName === 'envoy' ? 'envoy' : 'grpc'),
      (event) => events.push(event),
    );
    controlPlane = new grpc.Server();
    sut.addTo(controlPlane);
    const port = await new Promise<number>((resolve, reject) =>
      controlPlane.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, p) =>
        error ? reject(error) : resolve(p),
      ),
    );
    client = startXdsProbe({
      controlPlane: `127.0.0.1:${port}`,
      caller: 'gateway',
      target: 'xds:///router',
      method: '/test.Echo/Who',
      format: 'utf8',
    });
  });

  afterAll(async () => {
    client?.close();
    sut?.close();
    controlPlane?.forceShutdown();
    for (const backend of [stable, next]) backend?.server.forceShutdown();
  });

  it("serves a grpc-js-xds client the policy's routes: every call to the stable subset, and each resource acknowledged", async () => {
    expect(await tally(20)).toEqual({ stable: 20 });

    const nodes = sut.connectedNodes();
    expect(nodes).toHaveLength(1);
    expect(nodes[0]!.node).toMatchObject({
      id: expect.stringMatching(/^gateway-probe-/) as unknown,
      cluster: 'gateway',
    });
    expect(Object.keys(nodes[0]!.acked).sort()).toEqual([
      'type.googleapis.com/envoy.config.cluster.v3.Cluster',
      'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment',
      'type.googleapis.com/envoy.config.listener.v3.Listener',
    ]);
    expect(sut.counters.nacks).toBe(0);
  });

  it('applies a new split at run time without a new connection: 50/50 after the refresh', async () => {
    const sentBefore = sut.counters.responses;
    policy = policyWith([
      ['edges', 0, 'split'],
      [
        { subset: 'stable', weight: 50 },
        { subset: 'next', weight: 50 },
      ],
    ]);
    await refreshed();

    const counts = await tally(400);

    expect(sut.counters.responses).toBe(sentBefore + 1); // only the listener changed
    expect(counts['stable']! + counts['next']!).toBe(400);
    expect(counts['next']).toBeGreaterThan(140);
    expect(counts['stable']).toBeGreaterThan(140);
  });

  it('retries UNAVAILABLE on another endpoint as the policy says (gRFC A44): a failing instance loses no call', async () => {
    policy = policyWith(
      [['edges', 0, 'split'], [{ subset: 'stable', weight: 100 }]],
      [['edges', 0, 'loadBalancing'], { policy: 'round_robin' }],
    );
    instances = [instance(stable, 'stable'), { ...instance(next, 'stable'), id: 'next-as-stable' }];
    await refreshed();
    next.failing = true;
    const servedBefore = stable.served;

    const counts = await tally(50);
    next.failing = false;

    expect(counts).toEqual({ stable: 50 });
    expect(stable.served - servedBefore).toBe(50);
  });

  it('ejects an endpoint that keeps failing (outlier detection, gRFC A50): after an interval, no call goes to it', async () => {
    policy = policyWith(
      [['edges', 0, 'split'], [{ subset: 'stable', weight: 100 }]],
      [['edges', 0, 'loadBalancing'], { policy: 'round_robin' }],
      [['edges', 0, 'retry', 'attempts'], 1],
      [
        ['edges', 0, 'outlierDetection'],
        {
          interval: '500ms',
          baseEjectionTime: '30s',
          failurePercentage: { threshold: 50, minimumHosts: 2, requestVolume: 10 },
        },
      ],
    );
    const flaky = await startBackend('flaky'); // a new address: nothing ejected before
    flaky.failing = true;
    instances = [instance(stable, 'stable'), { ...instance(flaky, 'stable'), id: 'flaky' }];
    await refreshed();

    const before = await tally(40); // round robin: about half go to the failing one, with no retry
    // The client's sweep, every interval (500 ms of its own clock, in its own process), sees the failure share.
    await eventually(async () => (await tally(10))['stable'] === 10, 10_000);
    const after = await tally(40);
    flaky.server.forceShutdown();

    expect(before['error UNAVAILABLE']).toBeGreaterThan(5);
    expect(after).toEqual({ stable: 40 });
  });

  it('injects faults from the policy (gRFC A33): every call aborted with the status it names', async () => {
    policy = policyWith(
      [['edges', 0, 'fault'], { abort: { percent: 100, grpcStatus: 'RESOURCE_EXHAUSTED' } }],
      [['edges', 0, 'retry', 'attempts'], 1],
    );
    await refreshed();

    expect(await tally(10)).toEqual({ 'error RESOURCE_EXHAUSTED': 10 });
  });

  it('counts a NACK, and the client keeps its last good configuration', async () => {
    policy = policyWith([['edges', 0, 'split'], [{ subset: 'stable', weight: 100 }]]);
    instances = [instance(stable, 'stable'), instance(next, 'next')];
    await refreshed();
    // The client ACKs a listener before its channel has applied it: calls made at once may still meet
    // the fault the test before injected. The good configuration is the one it then serves with.
    await eventually(async () => (await tally(1))['stable'] === 1, 10_000);
    expect(await tally(5)).toEqual({ stable: 5 });
    const nacksBefore = sut.counters.nacks;

    // A cluster only Envoy can balance (least request without the round-robin fallback): grpc-js refuses it.
    const resources = xdsResources(policy, 'gateway', 'grpc', instances);
    const cluster = resources['type.googleapis.com/envoy.config.cluster.v3.Cluster'].get('router.stable') as {
      load_balancing_policy: { policies: unknown[] };
    };
    cluster.load_balancing_policy.policies.pop();
    serve = () => resources;
    await refreshed();

    expect(sut.counters.nacks).toBe(nacksBefore + 1);
    expect(events.find((e) => e.kind === 'nack')).toMatchObject({
      typeUrl: 'type.googleapis.com/envoy.config.cluster.v3.Cluster',
    });
    expect(await tally(5)).toEqual({ stable: 5 });
  });
});
