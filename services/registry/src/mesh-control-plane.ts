import { Inject, Injectable, type OnModuleDestroy } from '@nestjs/common';
import * as grpc from '@grpc/grpc-js';
import { Clock } from '@infermesh/clock';
import { AdsServer, EnvoyApi, inboundApiListener, subsetOf, xdsResources } from '@infermesh/mesh';
import { createRedisClient, type Redis } from '@infermesh/redis';
import { type InboundListenerSource, meshInstanceId } from '@infermesh/runtime';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { MeshInstances } from './mesh-instances';
import { RedisInstanceMirror } from './mesh-instances.redis';
import { MeshPolicyFile } from './mesh-policy.file';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';

/** How often a replica of the registry reads the instances the others hold (with Redis). */
const SHARE_POLL_MS = 1_000;

/**
 * The registry as the mesh's control plane: the instances that announce themselves, and, with a
 * policy file (REGISTRY_MESH_POLICY), the xDS server that compiles the policy and the instances into
 * each caller's listeners, routes, clusters and endpoints and pushes every change to the connected
 * clients, Envoy sidecars and proxyless gRPC alike. A policy change that does not validate is refused
 * and the running one stays. With Redis (REDIS_URL), its replicas share the instances, so that any
 * number of them serve the same endpoints.
 */
@Injectable()
export class MeshControlPlane implements OnModuleDestroy {
  readonly instances: MeshInstances;
  private readonly policyFile: MeshPolicyFile | undefined;
  private readonly ads: AdsServer | undefined;
  private readonly stopSweeping: () => void;
  private plaintextServer: grpc.Server | undefined;
  private readonly ownInbound: ((listener: unknown) => void)[] = [];
  /** With Redis: the instances shared with the other replicas of the registry. */
  private readonly mirror: { mirror: RedisInstanceMirror; client: Redis } | undefined;

  constructor(
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    logger: JsonLogger,
    metrics: Metrics,
    clock: Clock,
  ) {
    this.instances = new MeshInstances(config.mesh.instanceTimeoutMs, clock);
    metrics.gauge(
      'mesh_instances',
      'Instances announced to the control plane, by service and whether they serve.',
      ['service', 'serving'],
      (gauge) => {
        gauge.reset();
        for (const i of this.instances.list()) gauge.inc({ service: i.service, serving: String(i.healthy) });
      },
    );
    this.stopSweeping = clock.setRepeatingTimer(
      () => this.instances.sweep(),
      Math.max(100, Math.floor(config.mesh.instanceTimeoutMs / 3)),
    );
    if (config.redisUrl !== undefined) {
      // Several replicas of the registry each serve every instance, whichever it announced itself to.
      const client = createRedisClient(config.redisUrl, logger, 'registry-mesh');
      const holder = meshInstanceId('registry', config.runtime.mesh);
      this.mirror = {
        mirror: new RedisInstanceMirror(
          this.instances,
          client,
          config.redisKeyPrefix,
          holder,
          config.mesh.instanceTimeoutMs,
          SHARE_POLL_MS,
          logger,
          clock,
        ),
        client,
      };
      this.mirror.mirror.start();
    }
    if (config.mesh.policyPath === undefined) return;

    const policyFile = new MeshPolicyFile(config.mesh.policyPath, config.mesh.policyPollMs);
    this.policyFile = policyFile;
    const changes = metrics.counter(
      'mesh_policy_changes_total',
      'Changes of the mesh policy file, by outcome: applied, or refused (the running policy stays).',
      ['outcome'],
    );
    const events = metrics.counter(
      'xds_events_total',
      'xDS stream events: responses sent, ACKs, NACKs (the client kept its last version), resources refused.',
      ['event', 'type'],
    );
    const ads = new AdsServer(
      EnvoyApi.load(),
      (node) => {
        if (!MeshInstances.isService(node.cluster)) return undefined;
        const instances = this.instances.list();
        const self = instances.find((i) => i.id === node.id && i.service === node.cluster);
        return xdsResources(
          policyFile.policy,
          node.cluster,
          node.userAgentName === 'envoy' ? 'envoy' : 'grpc',
          instances,
          self,
        );
      },
      (event) => {
        switch (event.kind) {
          case 'sent':
          case 'ack':
            events.inc({ event: event.kind, type: event.typeUrl.split('.').at(-1)! });
            break;
          case 'nack':
            events.inc({ event: 'nack', type: event.typeUrl.split('.').at(-1)! });
            logger.warn('xDS client refused a resource update; it keeps its last version', {
              node: event.node.id,
              type: event.typeUrl,
              version: event.version,
              error: event.error,
            });
            break;
          case 'refused':
            events.inc({ event: 'refused', type: event.typeUrl.split('.').at(-1)! });
            logger.error(
              "xDS resource fails the check against Envoy's API; not served",
              new Error(event.problems.join('; ')),
            );
            break;
          case 'connected':
          case 'disconnected':
            break;
        }
      },
    );
    this.ads = ads;
    metrics.gauge('xds_clients', 'xDS clients connected to this control plane.', [], (gauge) =>
      gauge.set(ads.connectedNodes().length),
    );
    this.instances.onChange(() => ads.refresh());
    policyFile.watch((change) => {
      if (change.kind === 'applied') {
        changes.inc({ outcome: 'applied' });
        logger.info('mesh policy changed; pushing it to every xDS client', { path: policyFile.path });
        ads.refresh();
        for (const apply of this.ownInbound) apply(this.ownInboundListener());
      } else {
        changes.inc({ outcome: 'refused' });
        logger.warn('mesh policy change refused; the running policy stays', {
          path: policyFile.path,
          problems: change.problems,
        });
      }
    });
    logger.info('serving xDS (ADS) for the mesh policy', {
      path: policyFile.path,
      edges: policyFile.policy.edges.length,
    });
    const plaintextPort = config.mesh.plaintextXdsPort;
    if (plaintextPort !== undefined) {
      const server = new grpc.Server();
      ads.addTo(server);
      this.plaintextServer = server;
      // Loopback only: it carries the topology, not the registry's RPCs, to clients on this machine.
      server.bindAsync(`127.0.0.1:${plaintextPort}`, grpc.ServerCredentials.createInsecure(), (error, bound) => {
        if (error !== null)
          logger.error('cannot serve plaintext xDS on loopback; proxyless clients will not get the mesh', error);
        else logger.info('serving xDS (ADS only) in plaintext on loopback, for grpc-js-xds clients', { port: bound });
      });
    }
  }

  /**
   * The registry's own inbound listener (who may call it, the faults injected into its calls),
   * compiled here from the policy and followed as it changes: the control plane cannot ask itself
   * over xDS before it knows whom to answer.
   */
  ownInboundSource(): InboundListenerSource {
    return {
      watch: (apply) => {
        this.ownInbound.push(apply);
        apply(this.ownInboundListener());
      },
    };
  }

  private ownInboundListener(): unknown {
    if (this.policyFile === undefined) return undefined;
    const { policy } = this.policyFile;
    const { grpc: address, mesh } = this.config.runtime;
    return inboundApiListener(
      policy,
      'registry',
      subsetOf(policy, 'registry', mesh?.labels ?? {}),
      mesh?.address ?? address.host,
      address.port,
    );
  }

  /** The ADS service for the registry's gRPC server; none without a policy file. */
  xdsService(): { definition: grpc.ServiceDefinition; implementation: grpc.UntypedServiceImplementation }[] {
    return this.ads === undefined ? [] : [this.ads.service()];
  }

  async onModuleDestroy(): Promise<void> {
    this.stopSweeping();
    if (this.mirror !== undefined) {
      await this.mirror.mirror.stop();
      this.mirror.client.disconnect();
    }
    this.policyFile?.close();
    this.ads?.close();
    this.plaintextServer?.forceShutdown();
  }
}
