import type { MessageInitShape } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import { createClient, type TransportSecurity } from '@infermesh/grpc';
import { DEFAULT_TRUST_DOMAIN, IdentityIssuer, LocalCa } from '@infermesh/identity';
import { Health, HealthCheckResponse_ServingStatus } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import {
  type BatchingSchema,
  type ProcessingSchema,
  RegistryService,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { pause, registerModel, waitForVersionsReady } from './model-registration';
import {
  type LogSink,
  type RestartPolicy,
  SERVICE_NAMES,
  type ServiceName,
  ServiceProcess,
  type SupervisionEvent,
  serviceEntry,
} from './service-process';

/** How often a service rereads its identity files by default (they rotate at half-life, hours apart). */
const DEFAULT_TLS_REFRESH_MS = 30_000;

/** The mutual TLS settings of an identity folder (cert.pem, key.pem, ca.pem). */
function tlsOfDir(dir: string, refreshMs: number): TransportSecurity {
  return {
    certFile: join(dir, 'cert.pem'),
    keyFile: join(dir, 'key.pem'),
    caFile: join(dir, 'ca.pem'),
    trustDomain: DEFAULT_TRUST_DOMAIN,
    refreshMs,
  };
}

/** The ports of one worker. */
export interface WorkerPorts {
  grpc: number;
  metrics: number;
}

/** Every port the six services listen on. */
export interface SystemPorts {
  gatewayHttp: number;
  gatewayGrpc: number;
  gatewayMetrics: number;
  registry: number;
  registryMetrics: number;
  router: number;
  routerMetrics: number;
  cache: number;
  cacheMetrics: number;
  batcher: number;
  batcherMetrics: number;
  /** The first worker. */
  worker: number;
  workerMetrics: number;
  /** The workers after the first, in order, when the system runs more than one. */
  moreWorkers?: readonly WorkerPorts[];
  /** The instances after the first of a service with replicas, in order. */
  moreReplicas?: Partial<Record<ReplicatedService, readonly WorkerPorts[]>>;
  /**
   * With mutual TLS: the registry's plaintext xDS port on loopback, for the services' grpc-js-xds
   * clients (which speak only plaintext to their control plane).
   */
  registryXds?: number;
}

/** The services that may run several instances besides the workers: their callers reach them through the mesh. */
/**
 * The C library's settings a worker runs with, unless its environment sets them (the worker's
 * Kubernetes Deployment and the GPU image set the same). glibc gives an allocation pages of its own,
 * returned to the system when it is freed, only above a threshold that it raises, up to 32 MiB, each
 * time such a block is freed; past that, a model's weights come from the allocator's heaps, and when
 * the model is unloaded most of its memory stays in the worker. Fixed at 4 MiB, the threshold no
 * longer moves; blocks under it (a batch of 32 of the CNN's 110 KiB inputs is 3.5 MiB) still come
 * from the heaps. Fixing it also fixes the threshold above which glibc gives free memory at the top of
 * a heap back (128 KiB by default), so that is set to 32 MiB: at 128 KiB a heap shrinks and grows
 * again, a page fault per page, call after call (the worker's items/s at batch 32 fell by 15 %).
 * Measured by `npm run bench -- quantization` on a worker that loads the demo MLP (24 MiB of weights)
 * and then unloads it: unloading gave back 4.6 MiB of the 33.1 MiB its load was charged by default,
 * 28.6 of 30.3 with these settings; its int8 variant was charged 15.5 MiB instead of 20.8, and
 * unloading it gave back 8.2 MiB instead of 4.4; items/s did not change beyond the runs' spread. Only
 * workers: the other services hold no models, and up to 32 MiB more free memory kept per heap would
 * only count against their own memory budgets.
 */
export const WORKER_MALLOC_ENV: Readonly<Record<string, string>> = {
  MALLOC_MMAP_THRESHOLD_: String(4 << 20),
  MALLOC_TRIM_THRESHOLD_: String(32 << 20),
};

export const REPLICATED_SERVICES = ['router', 'batcher', 'cache'] as const;
export type ReplicatedService = (typeof REPLICATED_SERVICES)[number];

/** One instance of a replicated service. */
export interface ReplicaOptions {
  /** Environment of this instance alone, over the system's (INFERMESH_INSTANCE_LABELS, say). */
  env?: Record<string, string>;
}

/** The ports `npm start` uses: the KServe/Triton conventions for the gateway (8000 REST, 8001 gRPC, 8002 metrics). */
export const DEFAULT_PORTS: SystemPorts = {
  gatewayHttp: 8000,
  gatewayGrpc: 8001,
  gatewayMetrics: 8002,
  registry: 50051,
  registryMetrics: 9101,
  router: 50052,
  routerMetrics: 9102,
  cache: 50053,
  cacheMetrics: 9103,
  batcher: 50054,
  batcherMetrics: 9104,
  worker: 50055,
  workerMetrics: 9105,
  registryXds: 50050,
};

/**
 * The ports of a system with `workers` workers and `replicas` instances of the router, batcher or
 * cache: DEFAULT_PORTS, and for each instance after the first the first one's ports + 10·i
 * (worker 50065/9115, 50075/9125, …; router 50062/9112, …).
 */
export function defaultPorts(workers: number, replicas: Partial<Record<ReplicatedService, number>> = {}): SystemPorts {
  const more = (grpc: number, metrics: number, count: number) =>
    Array.from({ length: Math.max(0, count - 1) }, (_, i) => ({
      grpc: grpc + 10 * (i + 1),
      metrics: metrics + 10 * (i + 1),
    }));
  const moreReplicas = Object.fromEntries(
    REPLICATED_SERVICES.filter((s) => (replicas[s] ?? 1) > 1).map((s) => [
      s,
      more(DEFAULT_PORTS[s], DEFAULT_PORTS[`${s}Metrics`], replicas[s]!),
    ]),
  );
  if (workers <= 1 && Object.keys(moreReplicas).length === 0) return DEFAULT_PORTS;
  return {
    ...DEFAULT_PORTS,
    ...(workers > 1 && { moreWorkers: more(DEFAULT_PORTS.worker, DEFAULT_PORTS.workerMetrics, workers) }),
    ...(Object.keys(moreReplicas).length > 0 && { moreReplicas }),
  };
}

export interface ModelToRegister {
  name: string;
  version: string;
  bytes: Uint8Array;
  /** Pre- and post-processing to register the version with (input normalization, class labels). */
  processing?: MessageInitShape<typeof ProcessingSchema> | undefined;
  /** How the batcher queues and batches the version's requests; unset: every default. */
  batching?: MessageInitShape<typeof BatchingSchema> | undefined;
}

/** One worker process of the system. */
export interface WorkerOptions {
  /** The models it serves (WORKER_MODELS); unset or empty: every model. */
  models?: readonly string[];
  /** Environment of this worker alone, over the system's. */
  env?: Record<string, string>;
}

export interface SystemOptions {
  /** The compiled repository output (dist/). */
  distDir: string;
  /** Embedded stores and the worker's artifact cache live here. */
  dataDir: string;
  apiKey: string;
  /** When set, the registry and the cache use this Redis instead of the embedded stores. */
  redisUrl?: string | undefined;
  ports: SystemPorts;
  host?: string;
  sink: LogSink;
  /** Extra variables for every service (e.g. log levels). */
  env?: Record<string, string>;
  models: readonly ModelToRegister[];
  /**
   * The worker processes, each with its own ports (the first: `worker`/`workerMetrics`, the others:
   * `moreWorkers`), WORKER_ID, artifact directory and placement; the batcher dispatches to all of
   * them. Default: one worker serving every model.
   */
  workers?: readonly WorkerOptions[];
  /**
   * Instances of the router, batcher or cache, each with its own ports (`moreReplicas`), instance id
   * `<service>-<i>` and environment; more than one needs `mesh`. Default: one each.
   */
  replicas?: Partial<Record<ReplicatedService, readonly ReplicaOptions[]>>;
  readyTimeoutMs?: number;
  /** Called when a service exits without being asked to. */
  onUnexpectedExit?: (name: ServiceName, code: number | null, signal: NodeJS.Signals | null) => void;
  /**
   * Run the services in the mesh: the registry serves this policy file over xDS, every service
   * announces itself to it, and the gateway → router and router → cache/batcher calls go through
   * `xds:///<service>` (retries, outlier ejection, splits and faults of the policy). Unset: static addresses.
   */
  mesh?: { policyFile: string } | undefined;
  /**
   * Mutual TLS between the services (needs `mesh`): a local CA under the data directory issues each
   * instance a SPIFFE identity (`spiffe://infermesh.local/<service>`) valid `lifetimeMs` (default 4 h)
   * and issues it again at half-life; each service rereads its files every `refreshMs` (default
   * 30 s). This process calls the services as `spiffe://infermesh.local/operator`. Unset: plaintext.
   */
  mtls?: { lifetimeMs?: number; refreshMs?: number } | undefined;
  /** Told of each identity issued (logging); and of a failure to issue one again (it is retried). */
  onIdentity?: ((event: { instance: string; notAfter: Date } | { instance: string; error: Error }) => void) | undefined;
  /** Start a service that exits without being asked to again, by this policy (`infermesh up` does); unset: leave it stopped. */
  restartPolicy?: RestartPolicy | undefined;
  /** Told of each restart and crash loop (the line to log: describeSupervisionEvent). */
  onSupervision?: ((name: ServiceName, event: SupervisionEvent, instance?: number) => void) | undefined;
  /** Time: start-up deadlines, restart back-offs, identity renewals (systemClock unless given). */
  clock?: Clock | undefined;
}

/** Which metrics port belongs to which service. */
export function metricsPort(ports: SystemPorts, service: ServiceName): number {
  return ports[`${service}Metrics`];
}

/**
 * The six services as processes on one machine: the five behind the gateway first, then the models
 * registered and loaded, then the gateway, so that the system is ready when the gateway says so. Services can be killed and started again one by
 * one, as an operator or a chaos test would. There may be several workers; `process('worker')` is
 * the first, `workerProcess(i)` any of them.
 */
function isReplicated(name: ServiceName): name is ReplicatedService {
  return (REPLICATED_SERVICES as readonly string[]).includes(name);
}

export class System {
  /** Each service's process; for 'worker', the first worker. */
  readonly processes: ReadonlyMap<ServiceName, ServiceProcess>;
  readonly workerProcesses: readonly ServiceProcess[];
  /** Every instance of the router, batcher and cache, the first being processes.get(name). */
  readonly replicaProcesses: ReadonlyMap<ReplicatedService, readonly ServiceProcess[]>;
  readonly host: string;
  private readonly workers: readonly WorkerOptions[];
  private readonly clock: Clock;

  constructor(readonly options: SystemOptions) {
    this.host = options.host ?? '127.0.0.1';
    this.clock = options.clock ?? systemClock;
    this.workers = options.workers ?? [{}];
    if (this.workers.length === 0) throw new Error('a system needs at least one worker');
    const extraPorts = options.ports.moreWorkers?.length ?? 0;
    if (extraPorts < this.workers.length - 1) {
      throw new Error(
        `${this.workers.length} workers need the ports of ${this.workers.length - 1} more in SystemPorts.moreWorkers; it has ${extraPorts}`,
      );
    }
    const several = this.workers.length > 1;
    this.workerProcesses = this.workers.map((_, i) => {
      const sink: LogSink = several ? (service, line) => options.sink(service, line, i) : options.sink;
      return new ServiceProcess(
        'worker',
        serviceEntry(options.distDir, 'worker'),
        this.envForWorker(i),
        sink,
        options.onUnexpectedExit,
        {
          restart: options.restartPolicy,
          clock: this.clock,
          onSupervision: (name, event) => options.onSupervision?.(name, event, several ? i : undefined),
        },
      );
    });
    for (const service of REPLICATED_SERVICES) {
      const count = options.replicas?.[service]?.length ?? 1;
      if (count > 1 && options.mesh === undefined)
        throw new Error(
          `${count} ${service} instances need the mesh (SystemOptions.mesh): their callers reach them through xds:///${service}`,
        );
      const extra = options.ports.moreReplicas?.[service]?.length ?? 0;
      if (extra < count - 1)
        throw new Error(
          `${count} ${service} instances need the ports of ${count - 1} more in SystemPorts.moreReplicas.${service}; it has ${extra}`,
        );
    }
    if (options.mtls !== undefined) {
      if (options.mesh === undefined)
        throw new Error('mutual TLS needs the mesh (SystemOptions.mesh): its policy says which service may call which');
      if (options.ports.registryXds === undefined)
        throw new Error(
          "mutual TLS needs SystemPorts.registryXds: the services' xDS clients reach the control plane there",
        );
    }
    const replicas = new Map<ReplicatedService, ServiceProcess[]>();
    for (const service of REPLICATED_SERVICES) {
      const count = options.replicas?.[service]?.length ?? 1;
      replicas.set(
        service,
        Array.from({ length: count }, (_, i) => {
          const sink: LogSink = count > 1 ? (name, line) => options.sink(name, line, i) : options.sink;
          return new ServiceProcess(
            service,
            serviceEntry(options.distDir, service),
            this.envFor(service, i),
            sink,
            options.onUnexpectedExit,
            {
              restart: options.restartPolicy,
              clock: this.clock,
              onSupervision: (name, event) => options.onSupervision?.(name, event, count > 1 ? i : undefined),
            },
          );
        }),
      );
    }
    this.replicaProcesses = replicas;
    const map = new Map<ServiceName, ServiceProcess>();
    for (const name of SERVICE_NAMES) {
      map.set(
        name,
        name === 'worker'
          ? this.workerProcesses[0]!
          : isReplicated(name)
            ? replicas.get(name)![0]!
            : new ServiceProcess(
                name,
                serviceEntry(options.distDir, name),
                this.envFor(name),
                options.sink,
                options.onUnexpectedExit,
                {
                  restart: options.restartPolicy,
                  clock: this.clock,
                  onSupervision: options.onSupervision,
                },
              ),
      );
    }
    this.processes = map;
  }

  /** Every process of the system, each instance of each service. */
  get allProcesses(): ServiceProcess[] {
    return SERVICE_NAMES.flatMap((name) =>
      name === 'worker'
        ? [...this.workerProcesses]
        : isReplicated(name)
          ? [...this.replicaProcesses.get(name)!]
          : [this.process(name)],
    );
  }

  /** Instance `index` of a replicated service (0 the first, the same as process(name)). */
  instance(service: ReplicatedService, index: number): ServiceProcess {
    const found = this.replicaProcesses.get(service)![index];
    if (found === undefined)
      throw new RangeError(`no ${service} ${index}: the system runs ${this.replicaProcesses.get(service)!.length}`);
    return found;
  }

  /** The metrics URL of instance `index` of a replicated service. */
  instanceMetricsUrl(service: ReplicatedService, index: number): string {
    return `http://${this.host}:${this.instancePorts(service, index).metrics}/metrics`;
  }

  private instancePorts(service: ReplicatedService, index: number): WorkerPorts {
    if (index === 0) return { grpc: this.options.ports[service], metrics: this.options.ports[`${service}Metrics`] };
    const ports = this.options.ports.moreReplicas?.[service]?.[index - 1];
    if (ports === undefined) throw new RangeError(`no ${service} ${index}`);
    return ports;
  }

  static async start(options: SystemOptions): Promise<System> {
    const system = new System(options);
    await system.start();
    return system;
  }

  /**
   * Starts the services, registers the models and waits until the gateway is ready. stop() may be
   * called at any time, also while this runs: it then fails, and nothing is left running.
   */
  async start(): Promise<void> {
    const { options } = this;
    mkdirSync(options.dataDir, { recursive: true });
    try {
      if (options.mtls !== undefined) await this.issueIdentities(options.mtls);
      // The gateway opens last, once the models are READY: when it says ready, they can be called.
      for (const name of SERVICE_NAMES) {
        if (name === 'worker') for (const worker of this.workerProcesses) worker.start();
        else if (isReplicated(name)) for (const instance of this.replicaProcesses.get(name)!) instance.start();
        else if (name !== 'gateway') this.process(name).start();
      }
      const timeoutMs = options.readyTimeoutMs ?? 60_000;
      const deadline = this.clock.now() + timeoutMs;
      await this.waitForHealth('registry', deadline);
      const registry = createClient(RegistryService, `${this.host}:${options.ports.registry}`, {
        peer: 'registry',
        transport: this.operatorTls ?? null,
      });
      try {
        const names: string[] = [];
        for (const model of options.models) {
          const version = await registerModel(
            registry,
            model.name,
            model.version,
            model.bytes,
            model.processing,
            model.batching,
          );
          names.push(version.name);
        }
        await waitForVersionsReady(registry, names, Math.max(1, deadline - this.clock.now()), this.clock);
      } finally {
        registry.close();
      }
      if (this.stopping) throw new Error('stopped during start-up');
      // In the mesh, a service takes calls once the control plane has it: wait for each before the gateway opens.
      const instances = this.allProcesses.length;
      if (options.mesh !== undefined) await this.waitForAnnounced(instances - 1, deadline);
      this.process('gateway').start();
      await this.waitForGatewayReady(deadline);
      if (options.mesh !== undefined) await this.waitForAnnounced(instances, deadline);
    } catch (error) {
      await this.stop();
      throw error;
    }
  }

  get gatewayUrl(): string {
    return `http://${this.host}:${this.options.ports.gatewayHttp}`;
  }

  get gatewayGrpcAddress(): string {
    return `${this.host}:${this.options.ports.gatewayGrpc}`;
  }

  metricsUrl(service: ServiceName): string {
    return `http://${this.host}:${metricsPort(this.options.ports, service)}/metrics`;
  }

  grpcAddress(service: Exclude<ServiceName, 'gateway'>): string {
    return `${this.host}:${this.options.ports[service]}`;
  }

  process(name: ServiceName): ServiceProcess {
    return this.processes.get(name)!;
  }

  /** Worker `index` (0 the first, the same as process('worker')). */
  workerProcess(index: number): ServiceProcess {
    const worker = this.workerProcesses[index];
    if (worker === undefined)
      throw new RangeError(`no worker ${index}: the system runs ${this.workerProcesses.length}`);
    return worker;
  }

  workerGrpcAddress(index: number): string {
    return `${this.host}:${this.workerPorts(index).grpc}`;
  }

  workerMetricsUrl(index: number): string {
    return `http://${this.host}:${this.workerPorts(index).metrics}/metrics`;
  }

  private stopping = false;

  /** Stops every service gracefully, the gateway first. */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const name of [...SERVICE_NAMES].reverse()) {
      if (name === 'worker') await Promise.all(this.workerProcesses.map((worker) => worker.stop()));
      else if (isReplicated(name))
        await Promise.all(this.replicaProcesses.get(name)!.map((instance) => instance.stop()));
      else await this.process(name).stop();
    }
    this.issuer?.stop();
    this.issuer = undefined;
  }

  private issuer: IdentityIssuer | undefined;
  /** This process's identity with mutual TLS (`operator`), for its own calls to the services; undefined: plaintext. */
  private operatorTls: TransportSecurity | undefined;

  /** Where the identity files of an instance are (cert.pem, key.pem, ca.pem). */
  identityDir(instance: string): string {
    return join(this.options.dataDir, 'identity', instance);
  }

  /** Every instance's name in the mesh, with its service. */
  private instanceNames(): { service: ServiceName; instance: string }[] {
    return SERVICE_NAMES.flatMap((service) => {
      const count =
        service === 'worker'
          ? this.workerProcesses.length
          : isReplicated(service)
            ? this.replicaProcesses.get(service)!.length
            : 1;
      return Array.from({ length: count }, (_, i) => ({ service, instance: `${service}-${i}` }));
    });
  }

  /**
   * The local CA (kept under the data directory, reused while it is valid) issues every instance and
   * this process their identities before anything starts; they are issued again at half-life while
   * the system runs.
   */
  private async issueIdentities(mtls: NonNullable<SystemOptions['mtls']>): Promise<void> {
    const ca = await LocalCa.open(join(this.options.dataDir, 'identity-ca'));
    const issuer = new IdentityIssuer({
      ca,
      rootDir: join(this.options.dataDir, 'identity'),
      clock: this.clock,
      ...(mtls.lifetimeMs !== undefined && { lifetimeMs: mtls.lifetimeMs }),
      onIssued: (event) => this.options.onIdentity?.({ instance: event.identity.instance, notAfter: event.notAfter }),
      onError: (event) =>
        this.options.onIdentity?.({
          instance: event.identity.instance,
          error: event.error instanceof Error ? event.error : new Error(String(event.error)),
        }),
    });
    this.issuer = issuer;
    for (const { service, instance } of [...this.instanceNames(), { service: 'operator', instance: 'operator' }])
      await issuer.ensure({ service, instance });
    this.operatorTls = tlsOfDir(this.identityDir('operator'), mtls.refreshMs ?? DEFAULT_TLS_REFRESH_MS);
  }

  /** Starts one service again and waits until its health check says SERVING. */
  async restart(name: ServiceName, timeoutMs = 30_000): Promise<void> {
    this.process(name).start();
    await this.waitForHealth(name, this.clock.now() + timeoutMs);
  }

  /** Starts worker `index` again and waits until its health check says SERVING. */
  async restartWorker(index: number, timeoutMs = 30_000): Promise<void> {
    this.workerProcess(index).start();
    await this.waitForServing(
      this.workerProcess(index),
      `worker ${index}`,
      this.workerPorts(index).grpc,
      this.clock.now() + timeoutMs,
    );
  }

  async waitForHealth(name: ServiceName, deadline: number): Promise<void> {
    const port = name === 'gateway' ? this.options.ports.gatewayGrpc : this.options.ports[name];
    await this.waitForServing(this.process(name), name, port, deadline, name === 'gateway');
  }

  private async waitForServing(
    service: ServiceProcess,
    name: string,
    port: number,
    deadline: number,
    publicPort = false,
  ): Promise<void> {
    // The gateway's gRPC port is public (plaintext); the others take the operator's identity with mutual TLS.
    const health = createClient(Health, `${this.host}:${port}`, {
      transport: publicPort ? null : (this.operatorTls ?? null),
    });
    try {
      for (;;) {
        if (!service.running) throw new Error(`${name} exited during start-up (see its log lines)`);
        try {
          const { status } = await health.check({ service: '' }, { timeoutMs: 1_000 });
          if (status === HealthCheckResponse_ServingStatus.SERVING) return;
        } catch {
          // not listening yet
        }
        if (this.clock.now() > deadline) throw new Error(`${name} did not report SERVING in time`);
        await pause(this.clock, 100);
      }
    } finally {
      health.close();
    }
  }

  /** Waits until the registry has `count` instances announced and serving. */
  private async waitForAnnounced(count: number, deadline: number): Promise<void> {
    const instances = createClient(InstanceService, `${this.host}:${this.options.ports.registry}`, {
      peer: 'registry',
      transport: this.operatorTls ?? null,
    });
    try {
      for (;;) {
        const serving = await instances
          .listInstances({}, { timeoutMs: 1_000 })
          .then((r) => r.instances.filter((i) => i.serving).length)
          .catch(() => 0);
        if (serving >= count) return;
        if (this.clock.now() > deadline)
          throw new Error(`${serving} of ${count} services announced themselves to the mesh's control plane in time`);
        await pause(this.clock, 100);
      }
    } finally {
      instances.close();
    }
  }

  private async waitForGatewayReady(deadline: number): Promise<void> {
    for (;;) {
      if (!this.process('gateway').running) throw new Error('gateway exited during start-up (see its log lines)');
      try {
        const res = await fetch(`${this.gatewayUrl}/v2/health/ready`, { signal: AbortSignal.timeout(1_000) });
        if (res.status === 200) return;
      } catch {
        // not listening yet
      }
      if (this.clock.now() > deadline)
        throw new Error(`the gateway was not ready at ${this.gatewayUrl}/v2/health/ready in time`);
      await pause(this.clock, 100);
    }
  }

  /** The environment a service runs with: its ports, upstream addresses and stores (for starting another replica); for 'worker', the first worker's. */
  envFor(name: ServiceName, index = 0): NodeJS.ProcessEnv {
    if (name === 'worker') return this.envForWorker(index);
    const { ports, dataDir, redisUrl, apiKey } = this.options;
    const h = this.host;
    const env: NodeJS.ProcessEnv = { ...process.env, ...this.options.env };
    delete env['REDIS_URL'];
    if (redisUrl !== undefined && (name === 'registry' || name === 'cache' || name === 'gateway'))
      env['REDIS_URL'] = redisUrl;
    const prefix = name.toUpperCase();
    Object.assign(env, this.meshEnv(name, `${name}-${index}`));
    env[`${prefix}_GRPC_HOST`] = h;
    env[`${prefix}_METRICS_HOST`] = h;
    env[`${prefix}_METRICS_PORT`] = String(metricsPort(ports, name));
    switch (name) {
      case 'registry':
        env['REGISTRY_GRPC_PORT'] = String(ports.registry);
        env['REGISTRY_DATA_DIR'] = join(dataDir, 'registry');
        if (this.options.mesh !== undefined) env['REGISTRY_MESH_POLICY'] = this.options.mesh.policyFile;
        break;
      case 'cache':
        env['CACHE_GRPC_PORT'] = String(ports.cache);
        break;
      case 'batcher':
        env['BATCHER_GRPC_PORT'] = String(ports.batcher);
        // In the mesh the batcher finds the workers through the control plane, as they come and go.
        env['BATCHER_WORKER_ADDRESSES'] =
          this.options.mesh === undefined
            ? this.workers.map((_, i) => `${h}:${this.workerPorts(i).grpc}`).join(',')
            : 'mesh';
        env['BATCHER_REGISTRY_ADDRESS'] = `${h}:${ports.registry}`;
        break;
      case 'router':
        env['ROUTER_GRPC_PORT'] = String(ports.router);
        env['ROUTER_REGISTRY_ADDRESS'] = `${h}:${ports.registry}`;
        env['ROUTER_CACHE_ADDRESS'] = this.options.mesh === undefined ? `${h}:${ports.cache}` : 'xds:///cache';
        env['ROUTER_BATCHER_ADDRESS'] = this.options.mesh === undefined ? `${h}:${ports.batcher}` : 'xds:///batcher';
        // Without the mesh there is one batcher and nothing balances calls to it: they go carried on
        // one stream. In the mesh each is a call, balanced, retried and split by the mesh's policy.
        env['ROUTER_BATCHER_CARRIED'] = String(this.options.mesh === undefined);
        break;
      case 'gateway':
        env['GATEWAY_GRPC_PORT'] = String(ports.gatewayGrpc);
        env['GATEWAY_HTTP_HOST'] = h;
        env['GATEWAY_HTTP_PORT'] = String(ports.gatewayHttp);
        env['GATEWAY_ROUTER_ADDRESS'] = this.options.mesh === undefined ? `${h}:${ports.router}` : 'xds:///router';
        env['GATEWAY_ROUTER_CARRIED'] = String(this.options.mesh === undefined); // as the router's to the batcher
        env['GATEWAY_REGISTRY_ADDRESS'] = `${h}:${ports.registry}`;
        env['GATEWAY_API_KEYS'] = apiKey;
        env['GATEWAY_DATA_DIR'] = join(dataDir, 'gateway');
        break;
    }
    if (isReplicated(name)) {
      const own = this.instancePorts(name, index);
      env[`${prefix}_GRPC_PORT`] = String(own.grpc);
      env[`${prefix}_METRICS_PORT`] = String(own.metrics);
      return { ...env, ...this.options.replicas?.[name]?.[index]?.env };
    }
    return env;
  }

  /** The environment of worker `index`: its own ports, WORKER_ID (when there are several), artifact directory and placement. */
  envForWorker(index: number): NodeJS.ProcessEnv {
    const { ports, dataDir } = this.options;
    const h = this.host;
    const own = this.workerPorts(index);
    const env: NodeJS.ProcessEnv = { ...WORKER_MALLOC_ENV, ...process.env, ...this.options.env };
    delete env['REDIS_URL'];
    env['WORKER_GRPC_HOST'] = h;
    env['WORKER_GRPC_PORT'] = String(own.grpc);
    env['WORKER_METRICS_HOST'] = h;
    env['WORKER_METRICS_PORT'] = String(own.metrics);
    env['WORKER_REGISTRY_ADDRESS'] = `${h}:${ports.registry}`;
    env['WORKER_ARTIFACT_DIR'] = join(dataDir, index === 0 ? 'worker-artifacts' : `worker-artifacts-${index}`);
    if (this.workers.length > 1) env['WORKER_ID'] = `worker-${index}`;
    Object.assign(env, this.meshEnv('worker', `worker-${index}`));
    const models = this.workers[index]?.models ?? [];
    if (models.length > 0) env['WORKER_MODELS'] = models.join(',');
    return { ...env, ...this.workers[index]?.env };
  }

  /** A service's mesh settings: where the control plane is, who it is there, and its xDS client's bootstrap. */
  private meshEnv(service: ServiceName, instanceId: string): Record<string, string> {
    if (this.options.mesh === undefined) return {};
    const controlPlane = `${this.host}:${this.options.ports.registry}`;
    const { mtls } = this.options;
    // grpc-js-xds speaks only plaintext to its control plane: with mutual TLS, the registry's loopback xDS port.
    const xdsServer = mtls === undefined ? controlPlane : `127.0.0.1:${this.options.ports.registryXds}`;
    return {
      INFERMESH_MESH_CONTROL_PLANE: controlPlane,
      INFERMESH_INSTANCE_ID: instanceId,
      GRPC_XDS_BOOTSTRAP_CONFIG: JSON.stringify({
        xds_servers: [{ server_uri: xdsServer, channel_creds: [{ type: 'insecure' }], server_features: ['xds_v3'] }],
        node: { id: instanceId, cluster: service, locality: {} },
      }),
      ...(mtls !== undefined && {
        INFERMESH_TLS_DIR: this.identityDir(instanceId),
        INFERMESH_TLS_REFRESH_MS: String(mtls.refreshMs ?? DEFAULT_TLS_REFRESH_MS),
        ...(service === 'registry' && { REGISTRY_XDS_PLAINTEXT_PORT: String(this.options.ports.registryXds) }),
      }),
    };
  }

  private workerPorts(index: number): WorkerPorts {
    if (index === 0) return { grpc: this.options.ports.worker, metrics: this.options.ports.workerMetrics };
    const ports = this.options.ports.moreWorkers?.[index - 1];
    if (ports === undefined || index >= this.workers.length)
      throw new RangeError(`no worker ${index}: the system runs ${this.workers.length}`);
    return ports;
  }
}
