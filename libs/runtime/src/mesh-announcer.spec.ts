import { GrpcServer } from '@infermesh/grpc';
import { type Instance, InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { eventually } from '@infermesh/testing';
import { MeshAnnouncer } from './mesh-announcer';
import type { MeshSettings } from './runtime-config';

/**
 * The control plane's InstanceService as an announcing service sees it, served by the real GrpcServer
 * over a real socket: it lists no one and records the instance each announcement names.
 */
class FakeControlPlane {
  readonly announced: Instance[] = [];
  private server: GrpcServer | undefined;
  port = 0;

  async start(): Promise<this> {
    this.server = new GrpcServer({
      logger: new JsonLogger('registry', 'error', () => undefined),
      metrics: new Metrics('fake_control_plane'),
      maxMessageBytes: 1 << 20,
    });
    this.server.add(InstanceService, {
      listInstances: async () => ({ instances: [] }),
      announce: async (requests) => {
        for await (const request of requests) if (request.instance !== undefined) this.announced.push(request.instance);
        return { reason: 'the instance ended its announcement' };
      },
    });
    this.port = await this.server.listen('127.0.0.1', 0);
    return this;
  }

  async stop(): Promise<void> {
    await this.server?.shutdown(1);
  }
}

describe(MeshAnnouncer.name, () => {
  let controlPlane: FakeControlPlane;
  let sut: MeshAnnouncer | undefined;

  beforeEach(async () => {
    controlPlane = await new FakeControlPlane().start();
  });

  afterEach(async () => {
    await sut?.stop();
    sut = undefined;
    await controlPlane.stop();
  });

  function settings(sidecarPort: number | undefined): MeshSettings {
    return {
      controlPlane: `127.0.0.1:${controlPlane.port}`,
      instanceId: 'worker-0',
      address: '10.0.0.7',
      labels: { zone: 'a' },
      heartbeatMs: 60_000,
      sidecarPort,
    };
  }

  async function announced(sidecarPort: number | undefined): Promise<Instance> {
    sut = new MeshAnnouncer(
      'worker',
      settings(sidecarPort),
      { host: '0.0.0.0', port: 50055 },
      () => true,
      new JsonLogger('worker', 'error', () => undefined),
    );
    sut.start();
    await eventually(() => controlPlane.announced.length > 0);
    return controlPlane.announced[0]!;
  }

  it('announces its gRPC port without a sidecar', async () => {
    const instance = await announced(undefined);

    expect({
      service: instance.service,
      id: instance.id,
      address: instance.address,
      port: instance.port,
      labels: instance.labels,
    }).toEqual({
      service: 'worker',
      id: 'worker-0',
      address: '10.0.0.7',
      port: 50055,
      labels: { zone: 'a' },
    });
  });

  it("announces its sidecar's inbound port behind one, where the other services reach it", async () => {
    const instance = await announced(15006);

    expect({ address: instance.address, port: instance.port }).toEqual({ address: '10.0.0.7', port: 15006 });
  });
});
