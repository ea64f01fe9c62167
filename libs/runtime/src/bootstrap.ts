import 'reflect-metadata';
import type { DescService } from '@bufbuild/protobuf';
import type * as grpc from '@grpc/grpc-js';
import type { INestApplication, INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Clock } from '@infermesh/clock';
import {
  GrpcServer,
  type GrpcServerOptions,
  HealthService,
  type InboundAuthorization,
  type InboundFaults,
  type RpcError,
  type ServiceImpl,
  ServingStatus,
} from '@infermesh/grpc';
import { exitOnUnsupportedNode } from '@infermesh/config';
import { JsonLogger, Metrics, stopTracing } from '@infermesh/telemetry';
import type { Server } from 'node:http';
import { HealthDetails } from './health-details';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { MeshAnnouncer } from './mesh-announcer';
import { MeshXds } from './mesh-xds';
import { inboundAuthorizationOf, inboundFaultsOf, XDS_TYPES } from '@infermesh/mesh';
import { MonitoringServer } from './monitoring-server';
import { ownInboundFilters } from './runtime-config';
import { ServiceIdentity } from './runtime.module';

/** A generated service and the object implementing it. */
export interface GrpcBinding {
  service: DescService;
  impl: object;
  carried?: Record<string, string>;
}

/**
 * A service and its handlers; `carried` names its stream methods that carry a unary method's calls
 * (GrpcServer.add), which have no handler of their own.
 */
export function bind<S extends DescService, C extends keyof S['method'] & string = never>(
  service: S,
  impl: Omit<ServiceImpl<S>, C>,
  carried?: Record<C, keyof S['method'] & string>,
): GrpcBinding {
  return { service, impl, ...(carried !== undefined && { carried }) };
}

export interface BootstrapOptions {
  /** The root module; it imports RuntimeModule.forRoot(...). */
  module: unknown;
  /** The gRPC services to host, built from the application context. */
  grpc: (app: INestApplicationContext) => GrpcBinding[];
  /** Services whose messages are not generated from proto/ (the registry's xDS), hosted as they are. */
  untypedGrpc?: (
    app: INestApplicationContext,
  ) => { definition: grpc.ServiceDefinition; implementation: grpc.UntypedServiceImplementation }[];
  /** When set, the service also serves HTTP through Nest (the gateway's REST API). */
  /** `configure` runs before the application initialises, so global middleware, filters and guards apply. */
  http?: { host: string; port: number; configure?: (app: INestApplication) => void };
  /** Runs after every listener is bound; the health status is set to SERVING when it resolves. */
  onListening?: (app: INestApplicationContext) => Promise<void>;
  /**
   * Calls refused before grpc-js reads them (GrpcServer.shedWith): given a call's method path, the
   * error to answer it with now, or undefined to let it through.
   */
  shed?: (app: INestApplicationContext) => (path: string) => RpcError | undefined;
  /** Runs first when the service is asked to stop, before in-flight calls are waited for. */
  beforeShutdown?: (app: INestApplicationContext) => void;
  /**
   * The gRPC port faces clients outside the mesh (the gateway's public API, checked by API key): it
   * takes no client certificate and no mesh authorization, whatever the service's identity.
   */
  publicGrpc?: boolean;
  /** Bounds of the gRPC port against callers that open calls and never send them (GrpcServerOptions); none: unbounded. */
  grpcLimits?: Pick<
    GrpcServerOptions,
    'receiveTimeoutMs' | 'sendTimeoutMs' | 'maxConcurrentStreams' | 'maxCallsAwaitingRequest'
  >;
  /**
   * Where the service's inbound listener (its authorization and injected faults) comes from when not
   * over its own xDS stream: the control plane itself, which cannot ask itself before it authorizes.
   */
  inboundListener?: (app: INestApplicationContext) => InboundListenerSource;
}

/** Gives the service's inbound listener (undefined: none yet) now and each time it changes. */
export interface InboundListenerSource {
  watch(apply: (listener: unknown) => void): void;
}

/** With mutual TLS and a policy that has no authorization (`mtls: false`): any caller with a certificate of the mesh. */
const ANY_MESH_CALLER: InboundAuthorization = {
  allows: (identity) => identity !== undefined,
  describe: () => 'any caller with a certificate of the mesh: the policy authorizes nothing more precisely',
};

/** The inbound filters a listener says: the faults to inject, and who may call what (undefined: no listener yet). */
function inboundFilters(listener: unknown): {
  faults: InboundFaults | undefined;
  authorization: InboundAuthorization | undefined;
} {
  if (listener === undefined) return { faults: undefined, authorization: undefined };
  return { faults: inboundFaultsOf(listener), authorization: inboundAuthorizationOf(listener) ?? ANY_MESH_CALLER };
}

export interface RunningService {
  app: INestApplicationContext;
  grpcPort: number;
  metricsPort: number;
  httpPort: number | undefined;
  /** Graceful shutdown: stop accepting, finish in-flight work, release resources. */
  stop(): Promise<void>;
}

/**
 * Starts a service: Nest application, gRPC server with the standard health service, Prometheus
 * metrics and health details on their own port (GET /metrics, GET /health), optional HTTP; SIGTERM
 * and SIGINT shut it down gracefully.
 */
export async function bootstrap(options: BootstrapOptions): Promise<RunningService> {
  const moduleRef = options.module as Parameters<typeof NestFactory.createApplicationContext>[0];
  const app: INestApplicationContext = options.http
    ? await NestFactory.create(moduleRef, { bufferLogs: true, bodyParser: false })
    : await NestFactory.createApplicationContext(moduleRef, { bufferLogs: true });
  const logger = app.get(JsonLogger);
  app.useLogger(logger);
  const identity = app.get(ServiceIdentity);
  const { settings } = identity;
  const health = app.get(HealthService);
  const metrics = app.get(Metrics);
  const clock = app.get(Clock);

  const filters = ownInboundFilters(settings, options.publicGrpc === true);
  const grpcServer = new GrpcServer({
    logger,
    metrics,
    maxMessageBytes: settings.maxMessageBytes,
    faultInjection: filters.faultInjection,
    authorization: filters.authorization,
    public: options.publicGrpc === true,
    ...options.grpcLimits,
    clock,
  });
  // In the mesh, who may call what and the faults the policy injects here come in the service's
  // inbound listener: over its own xDS stream, or from where the service says. Behind a sidecar the
  // sidecar applies it, and the service does not follow it.
  const xds = app.get(MeshXds);
  const followsInbound = filters.faultInjection || filters.authorization;
  let authorizedOnce: () => void = () => undefined;
  const authorized = new Promise<void>((resolve) => (authorizedOnce = resolve));
  const applyInbound = ({ faults, authorization }: ReturnType<typeof inboundFilters>) => {
    grpcServer.setInboundFaults(faults);
    if (authorization === undefined) return;
    grpcServer.setInboundAuthorization(authorization);
    authorizedOnce();
  };
  const localInbound = followsInbound ? options.inboundListener?.(app) : undefined;
  if (localInbound !== undefined) {
    localInbound.watch((listener) => {
      try {
        applyInbound(inboundFilters(listener));
      } catch (error) {
        logger.error(
          'the inbound listener cannot be applied; the last one stays',
          error instanceof Error ? error : new Error(String(error)),
        );
      }
    });
  } else if (followsInbound) {
    xds.client?.watch(XDS_TYPES.listener, ['inbound'], {
      parse: (resources) => inboundFilters(resources.get('inbound')),
      apply: applyInbound,
    });
  }
  grpcServer.add(Health, health);
  health.set('', ServingStatus.NOT_SERVING);
  const bindings = options.grpc(app);
  for (const { service, impl, carried } of bindings) {
    grpcServer.add(service, impl, carried);
    health.set(service.typeName, ServingStatus.NOT_SERVING);
  }
  for (const { definition, implementation } of options.untypedGrpc?.(app) ?? [])
    grpcServer.addUntyped(definition, implementation);
  if (options.shed !== undefined) grpcServer.shedWith(options.shed(app));
  if (options.http) options.http.configure?.(app as INestApplication);
  await app.init();

  const grpcPort = await grpcServer.listen(settings.grpc.host, settings.grpc.port);
  const metricsServer = new MonitoringServer(metrics, app.get(HealthDetails), settings.metricsToken);
  const metricsPort = await metricsServer.listen(settings.metrics.host, settings.metrics.port);
  let httpPort: number | undefined;
  let httpServer: Server | undefined;
  if (options.http) {
    const httpApp = app as INestApplication;
    await httpApp.listen(options.http.port, options.http.host);
    httpServer = httpApp.getHttpServer() as Server;
    const address = httpServer.address();
    httpPort = typeof address === 'object' && address !== null ? address.port : options.http.port;
  }
  await options.onListening?.(app);
  // A service that authorizes its callers itself (mutual TLS, no sidecar) serves once it knows whom
  // to answer: until its authorization arrives (over its xDS stream, once it has announced itself)
  // it reports NOT_SERVING, so that no caller and no readiness check counts on it.
  const gated = filters.authorization;
  if (!gated) health.setAll(ServingStatus.SERVING);
  // In the mesh, the service announces itself; the control plane sends it calls once it says it serves.
  const announcer =
    settings.mesh === undefined
      ? undefined
      : new MeshAnnouncer(
          identity.name,
          settings.mesh,
          { host: settings.grpc.host, port: grpcPort },
          () => health.get() === ServingStatus.SERVING && !grpcServer.isDraining,
          logger,
          clock,
        );
  announcer?.start();
  xds.start();
  let stopping: Promise<void> | undefined;
  if (gated) {
    const stopWaiting = clock.setRepeatingTimer(
      () => logger.warn('not serving yet: the authorization policy has not arrived from the mesh control plane'),
      10_000,
    );
    void authorized.then(() => {
      stopWaiting();
      if (stopping !== undefined) return;
      health.setAll(ServingStatus.SERVING);
      announcer?.heartbeatNow();
    });
  }
  logger.info(`${identity.name} listening`, { grpc_port: grpcPort, metrics_port: metricsPort, http_port: httpPort });

  const stop = () =>
    (stopping ??= (async () => {
      logger.info(`${identity.name} shutting down`);
      health.setAll(ServingStatus.NOT_SERVING);
      // Withdrawn from the mesh first, so that no new call is routed here while the rest drains.
      await announcer?.stop();
      xds.close();
      options.beforeShutdown?.(app);
      const httpClosed = httpServer
        ? new Promise<void>((resolve) => {
            httpServer.close(() => resolve());
            httpServer.closeIdleConnections();
          })
        : Promise.resolve();
      await Promise.all([grpcServer.shutdown(settings.shutdownGraceMs), httpClosed]);
      await app.close();
      await metricsServer.close();
      // The last spans (those of the calls just drained) are exported before the process ends.
      await stopTracing().catch((error: unknown) =>
        logger.warn('the last spans could not be exported', { err: String(error) }),
      );
      logger.info(`${identity.name} stopped`);
    })());

  return { app, grpcPort, metricsPort, httpPort, stop };
}

/** What the last-resort guard does: write a log line, stop the process. */
export interface LastResortOptions {
  service: string;
  /** Whether the service has started: before, any failure stops it. */
  started: () => boolean;
  write?: (line: string) => void;
  exit?: (code: number) => void;
}

/**
 * The handler of `uncaughtException` and `unhandledRejection`: before the service has started it
 * logs the failure as fatal and exits 1; once started it logs it and the service goes on. Requests
 * fail on their own (GrpcServer and the REST error filter answer INTERNAL for the one request that
 * threw); what reaches this guard belongs to no request, and no input may take the process down.
 */
export function lastResortGuard(what: string, options: LastResortOptions): (error: unknown) => void {
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const exit = options.exit ?? ((code: number) => process.exit(code));
  return (error: unknown) => {
    const fatal = !options.started();
    const msg = fatal ? `${what}: the service stops` : `${what}; the service goes on`;
    write(
      `${JSON.stringify({ time: new Date().toISOString(), level: fatal ? 'fatal' : 'error', service: options.service, msg, err: String(error instanceof Error ? error.stack : error) })}\n`,
    );
    if (fatal) exit(1);
  };
}

/**
 * Runs a service as a process: bootstrap, then exit cleanly on SIGTERM / SIGINT. A failure to start
 * exits; once started, an exception or a rejection nothing caught is logged and the service goes on
 * (lastResortGuard).
 */
export function runMain(name: string, start: () => Promise<RunningService>): void {
  exitOnUnsupportedNode(`infermesh ${name}`);
  let started = false;
  const fatal = lastResortGuard('failure', { service: name, started: () => false });
  process.on('uncaughtException', lastResortGuard('uncaught exception', { service: name, started: () => started }));
  process.on(
    'unhandledRejection',
    lastResortGuard('unhandled promise rejection', { service: name, started: () => started }),
  );
  // A log reader that went away (a closed pipe) must not take the service down with it.
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code !== 'EPIPE') fatal(error);
    });
  }
  start().then((running) => {
    started = true;
    let signals = 0;
    const onSignal = () => {
      signals += 1;
      if (signals > 1) process.exit(130);
      running.stop().then(
        () => process.exit(0),
        (error: unknown) => fatal(error),
      );
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    // Started by a supervisor with an IPC channel (infermesh up, the tests): when the supervisor
    // dies the channel closes, and the service shuts down instead of living on as an orphan.
    if (process.send !== undefined) process.once('disconnect', onSignal);
  }, fatal);
}
