import { Injectable } from '@nestjs/common';
import { type CallContext, Errors } from '@infermesh/grpc';
import type { MeshInstance } from '@infermesh/mesh';
import type { AnnounceRequest, Instance } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { JsonLogger } from '@infermesh/telemetry';
import { MeshControlPlane } from './mesh-control-plane';
import { MeshInstances } from './mesh-instances';

/** An announced instance, checked: INVALID_ARGUMENT naming the field otherwise. */
function instanceOf(given: Instance | undefined): MeshInstance {
  const bad = (field: string, why: string) => Errors.invalidInstance(`instance.${field}: ${why}`);
  if (given === undefined) throw bad('(all)', 'the first message of Announce must name the instance');
  if (!MeshInstances.isService(given.service))
    throw bad(
      'service',
      `must be registry, cache, worker, batcher, router or gateway, got "${given.service.slice(0, 64)}"`,
    );
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$/.test(given.id))
    throw bad('id', 'must be 1 to 253 letters, digits, dots, dashes or underscores');
  if (given.address === '' || given.address.length > 253) throw bad('address', 'must be a host name or address');
  if (given.port === 0 || given.port > 65535) throw bad('port', `must be 1 to 65535, got ${given.port}`);
  const labels = Object.entries(given.labels);
  if (labels.length > 16 || labels.some(([k, v]) => k.length > 63 || v.length > 63))
    throw bad('labels', 'at most 16, keys and values at most 63 characters');
  return {
    service: given.service,
    id: given.id,
    address: given.address,
    port: given.port,
    labels: given.labels,
    healthy: true,
  };
}

/** InstanceService: instances announce themselves for as long as their stream stays open. */
@Injectable()
export class InstancesGrpcController {
  constructor(
    private readonly controlPlane: MeshControlPlane,
    private readonly logger: JsonLogger,
  ) {}

  async listInstances() {
    return {
      instances: this.controlPlane.instances.list().map((i) => ({
        instance: { service: i.service, id: i.id, address: i.address, port: i.port, labels: { ...i.labels } },
        serving: i.healthy,
      })),
    };
  }

  async announce(requests: AsyncIterable<AnnounceRequest>, _ctx: CallContext) {
    const { instances } = this.controlPlane;
    let announced: { id: string; token: symbol } | undefined;
    try {
      for await (const request of requests) {
        if (announced === undefined) {
          const instance = { ...instanceOf(request.instance), healthy: request.serving };
          announced = { id: instance.id, token: instances.announce(instance) };
          this.logger.info('instance announced', {
            instance_service: instance.service,
            id: instance.id,
            address: `${instance.address}:${instance.port}`,
            serving: instance.healthy,
          });
        } else {
          instances.heartbeat(announced.id, announced.token, request.serving);
        }
      }
    } finally {
      if (announced !== undefined) {
        instances.withdraw(announced.id, announced.token);
        this.logger.info('instance withdrawn: its announcement ended', { id: announced.id });
      }
    }
    return { reason: 'the instance ended its announcement' };
  }
}
