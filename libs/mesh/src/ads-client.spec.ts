import * as grpc from '@grpc/grpc-js';
import { eventually } from '@infermesh/testing';
import { AdsClient, type AdsClientEvent, type XdsUpdate } from './ads-client';
import { type AdsEvent, AdsServer } from './ads-server';
import { EnvoyApi } from './envoy-api-check';
import { type MeshPolicy } from './mesh-policy';
import { type MeshInstance, XDS_TYPES, xdsResources } from './xds-resources';
import { policyWith } from './policy.testing';

/** Resolves with the next value `next()` is called with. */
function nextValue<T>(): { promise: Promise<T>; next: (value: T) => void; reset: () => void } {
  let resolve!: (value: T) => void;
  const holder = {
    promise: new Promise<T>((r) => (resolve = r)),
    next: (value: T) => resolve(value),
    reset: () => {
      holder.promise = new Promise<T>((r) => (resolve = r));
    },
  };
  return holder;
}

describe(AdsClient.name, () => {
  const api = EnvoyApi.load();
  let server: grpc.Server;
  let ads: AdsServer;
  let port: number;
  let policy: MeshPolicy;
  let serverEvents: AdsEvent[];
  let clients: AdsClient[];
  const batcher = (id: string, track: string): MeshInstance => ({
    service: 'batcher',
    id,
    address: '127.0.0.1',
    port: 7001,
    labels: { track },
    healthy: true,
  });
  const workers: MeshInstance[] = [
    { service: 'worker', id: 'worker-0', address: '127.0.0.1', port: 7100, labels: {}, healthy: true },
    { service: 'worker', id: 'worker-1', address: '127.0.0.1', port: 7101, labels: {}, healthy: false },
  ];
  let instances: MeshInstance[];

  beforeEach(async () => {
    policy = policyWith([
      ['services', 'batcher', 'inboundFault'],
      { subset: 'next', abort: { percent: 10, grpcStatus: 'UNAVAILABLE' } },
    ]);
    instances = [batcher('batcher-0', 'stable'), batcher('batcher-1', 'next'), ...workers];
    serverEvents = [];
    clients = [];
    ads = new AdsServer(
      api,
      (node) =>
        xdsResources(
          policy,
          'batcher',
          'grpc',
          instances,
          instances.find((i) => i.id === node.id),
        ),
      (event) => serverEvents.push(event),
    );
    server = new grpc.Server();
    ads.addTo(server);
    port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, p) =>
        error ? reject(error) : resolve(p),
      ),
    );
  });

  afterEach(() => {
    for (const client of clients) client.close();
    ads.close();
    server.forceShutdown();
  });

  function client(id: string, events: AdsClientEvent[] = []): AdsClient {
    const sut = new AdsClient(api, `127.0.0.1:${port}`, { id, cluster: 'batcher' }, (event) => events.push(event));
    clients.push(sut);
    return sut;
  }

  it('receives the resources it watches, decoded into the JSON form they were compiled in', async () => {
    const sut = client('batcher-1');
    const listeners = nextValue<XdsUpdate>();
    const endpoints = nextValue<XdsUpdate>();
    sut.watch(XDS_TYPES.listener, ['inbound', 'worker'], { parse: (r) => r, apply: listeners.next });
    sut.watch(XDS_TYPES.endpoint, ['worker'], { parse: (r) => r, apply: endpoints.next });
    sut.start();

    const served = xdsResources(policy, 'batcher', 'grpc', instances, instances[1]);
    const gotListeners = await listeners.promise;
    expect([...gotListeners.keys()].sort()).toEqual(['inbound', 'worker']);
    // What comes back is what was compiled: encode and decode are inverses on it.
    expect(gotListeners.get('inbound')).toEqual(served[XDS_TYPES.listener].get('inbound'));
    expect(gotListeners.get('worker')).toEqual(served[XDS_TYPES.listener].get('worker'));
    expect(JSON.stringify(gotListeners.get('inbound'))).toContain('"grpc_status":14');
    expect((await endpoints.promise).get('worker')).toEqual(served[XDS_TYPES.endpoint].get('worker'));
  });

  it("gets the subset-less inbound listener when its instance is outside the fault's subset", async () => {
    const sut = client('batcher-0');
    const listeners = nextValue<XdsUpdate>();
    sut.watch(XDS_TYPES.listener, ['inbound'], { parse: (r) => r, apply: listeners.next });
    sut.start();
    expect(JSON.stringify((await listeners.promise).get('inbound'))).not.toContain('fault');
  });

  it('takes a new version when the control plane pushes one, and ACKs it', async () => {
    const sut = client('batcher-1');
    const updates: XdsUpdate[] = [];
    const listeners = nextValue<XdsUpdate>();
    sut.watch(XDS_TYPES.listener, ['inbound'], {
      parse: (r) => r,
      apply: (update) => {
        updates.push(update);
        listeners.next(update);
      },
    });
    sut.start();
    await listeners.promise;
    listeners.reset();
    policy = policyWith([
      ['services', 'batcher', 'inboundFault'],
      { subset: 'next', abort: { percent: 50, grpcStatus: 'INTERNAL' } },
    ]);
    ads.refresh();
    const second = await listeners.promise;
    expect(JSON.stringify(second.get('inbound'))).toContain('"grpc_status":13');
    // The first version's ACK may come after the second was sent: the server takes it as stale.
    const lastSent = () => serverEvents.filter((e) => e.kind === 'sent').at(-1);
    await eventually(() =>
      serverEvents.some((e) => e.kind === 'ack' && e.version === (lastSent() as { version: string }).version),
    );
    expect(serverEvents.filter((e) => e.kind === 'nack')).toEqual([]);
  });

  it('NACKs an update its validator refuses, naming why, and keeps the version it had', async () => {
    const events: AdsClientEvent[] = [];
    const sut = client('batcher-1', events);
    const accepted: XdsUpdate[] = [];
    sut.watch(XDS_TYPES.listener, ['inbound'], {
      parse: (update) => {
        if (JSON.stringify(update.get('inbound')).includes('"grpc_status":13'))
          throw new Error('INTERNAL is not injected here');
        return update;
      },
      apply: (update) => accepted.push(update),
    });
    sut.start();
    await eventually(() => accepted.length === 1);
    policy = policyWith([
      ['services', 'batcher', 'inboundFault'],
      { subset: 'next', abort: { percent: 50, grpcStatus: 'INTERNAL' } },
    ]);
    ads.refresh();
    await eventually(() => serverEvents.some((e) => e.kind === 'nack'));
    expect(serverEvents.find((e) => e.kind === 'nack')).toMatchObject({ error: 'INTERNAL is not injected here' });
    expect(events.filter((e) => e.kind === 'nack')).toHaveLength(1);
    expect(accepted).toHaveLength(1);
  });

  it('connects again after the control plane restarts, and asks for its resources again', async () => {
    const events: AdsClientEvent[] = [];
    const sut = client('batcher-1', events);
    const updates: XdsUpdate[] = [];
    sut.watch(XDS_TYPES.cluster, ['worker'], { parse: (r) => r, apply: (update) => updates.push(update) });
    sut.start();
    await eventually(() => updates.length === 1);
    ads.close();
    server.forceShutdown();
    await eventually(() => events.some((e) => e.kind === 'disconnected'));
    server = new grpc.Server();
    ads.addTo(server);
    await new Promise<number>((resolve, reject) =>
      server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (error, p) =>
        error ? reject(error) : resolve(p),
      ),
    );
    await eventually(() => updates.length === 2, 10_000);
    expect(updates[1]!.get('worker')).toEqual(updates[0]!.get('worker'));
  });
});
