import {
  ConfigError,
  host,
  logLevel,
  optionalPort,
  port,
  positiveInt,
  tracingSettings,
  tracingShape,
} from '@infermesh/config';
import type { TransportSecurity } from '@infermesh/grpc';
import { join } from 'node:path';
import { z } from 'zod';

/** The settings every service shares, read from `<PREFIX>_*` variables. */
export interface RuntimeSettings {
  grpc: { host: string; port: number };
  metrics: { host: string; port: number };
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  shutdownGraceMs: number;
  maxMessageBytes: number;
  /** Set when the service announces itself to the mesh's control plane (INFERMESH_MESH_CONTROL_PLANE). */
  mesh: MeshSettings | undefined;
  /**
   * The instance's identity (INFERMESH_TLS_DIR); undefined: none. Without a sidecar, mutual TLS on
   * every gRPC port and call of the process. Behind one (`mesh.sidecarPort`), the process speaks
   * plaintext (its sidecar does mutual TLS), and this identity serves only the calls that bypass the
   * sidecar: the batcher's to the workers it chooses itself.
   */
  tls: TransportSecurity | undefined;
  /** The bearer token GET /metrics needs (INFERMESH_METRICS_TOKEN); undefined: none. */
  metricsToken: string | undefined;
  /** Traces exported over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables); undefined: off. */
  tracing: ReturnType<typeof tracingSettings>;
}

/** How a service takes part in the mesh: where the control plane is, and who it is there. */
export interface MeshSettings {
  /** The registry's gRPC address, where it announces itself. */
  controlPlane: string;
  /** Unique among the mesh's instances (INFERMESH_INSTANCE_ID; default <service>-<host>-<pid>). */
  instanceId: string | undefined;
  /** Where the other services reach it (INFERMESH_INSTANCE_ADDRESS; default the gRPC host). */
  address: string | undefined;
  /** Labels that place it in the policy's subsets (INFERMESH_INSTANCE_LABELS: track=next,zone=a). */
  labels: Record<string, string>;
  /** How often it tells the control plane it is alive. */
  heartbeatMs: number;
  /**
   * The inbound port of this pod's Envoy sidecar (INFERMESH_SIDECAR_PORT), announced as where the
   * other services reach this instance. The sidecar terminates mutual TLS, authorizes callers and
   * injects the policy's faults, so the service does none of these on its own port (which only the
   * sidecar and the kubelet's probes reach). Undefined: no sidecar; the service does them itself.
   */
  sidecarPort: number | undefined;
}

const labelList = () =>
  z
    .string()
    .optional()
    .transform((value, ctx) => {
      const labels: Record<string, string> = {};
      for (const part of (value ?? '')
        .split(',')
        .map((p) => p.trim())
        .filter((p) => p !== '')) {
        const match = /^([A-Za-z0-9][A-Za-z0-9._-]{0,62})=([A-Za-z0-9._-]{1,63})$/.exec(part);
        if (match === null) {
          ctx.addIssue({
            code: 'custom',
            message: `expected key=value pairs separated by commas (letters, digits, . _ -), got "${part}"`,
          });
          return z.NEVER;
        }
        labels[match[1]!] = match[2]!;
      }
      return labels;
    });

/** The mesh settings every service shares (not prefixed: one mesh per machine or pod). */
export const meshShape = {
  INFERMESH_MESH_CONTROL_PLANE: z
    .string()
    .regex(/^(?:[^\s:]+|\[[0-9a-fA-F:]+\]):\d{1,5}$/, 'expected host:port')
    .optional(),
  INFERMESH_INSTANCE_ID: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$/, 'expected letters, digits, dots, dashes or underscores')
    .optional(),
  INFERMESH_INSTANCE_ADDRESS: z.string().min(1).max(253).optional(),
  INFERMESH_INSTANCE_LABELS: labelList(),
  INFERMESH_HEARTBEAT_MS: positiveInt(5_000),
  INFERMESH_SIDECAR_PORT: optionalPort(),
};

/**
 * The identity every service shares the layout of: a folder with its certificate (`cert.pem`, its
 * SPIFFE ID as a URI SAN), its key (`key.pem`) and the trust bundle (`ca.pem`), reread as they rotate.
 */
export const tlsShape = {
  INFERMESH_TLS_DIR: z.string().min(1).optional(),
  INFERMESH_TRUST_DOMAIN: z
    .string()
    .regex(/^[a-z0-9.-]+$/, 'expected a trust domain such as infermesh.local')
    .default('infermesh.local'),
  INFERMESH_TLS_REFRESH_MS: positiveInt(30_000),
  /** When set, GET /metrics on every service's monitoring port needs `Authorization: Bearer <it>`. */
  INFERMESH_METRICS_TOKEN: z.string().min(16, 'expected a token of at least 16 characters').optional(),
};

/**
 * The zod shape of the shared settings for a service whose variables start with `prefix`, e.g.
 * ROUTER_GRPC_PORT, ROUTER_METRICS_PORT, ROUTER_LOG_LEVEL, ROUTER_SHUTDOWN_GRACE_MS.
 */
export function runtimeShape<P extends string>(prefix: P, ports: { grpc: number; metrics: number }) {
  return {
    [`${prefix}_GRPC_HOST`]: host('127.0.0.1'),
    [`${prefix}_GRPC_PORT`]: port(ports.grpc),
    [`${prefix}_METRICS_HOST`]: host('127.0.0.1'),
    [`${prefix}_METRICS_PORT`]: port(ports.metrics),
    [`${prefix}_LOG_LEVEL`]: logLevel(),
    [`${prefix}_SHUTDOWN_GRACE_MS`]: positiveInt(10_000),
    [`${prefix}_MAX_MESSAGE_BYTES`]: positiveInt(64 * 1024 * 1024),
    ...meshShape,
    ...tlsShape,
    ...tracingShape,
  } as typeof meshShape &
    typeof tlsShape &
    typeof tracingShape &
    Record<`${P}_${'GRPC_HOST' | 'METRICS_HOST'}`, ReturnType<typeof host>> &
    Record<`${P}_${'GRPC_PORT' | 'METRICS_PORT'}`, ReturnType<typeof port>> &
    Record<`${P}_LOG_LEVEL`, ReturnType<typeof logLevel>> &
    Record<`${P}_${'SHUTDOWN_GRACE_MS' | 'MAX_MESSAGE_BYTES'}`, ReturnType<typeof positiveInt>>;
}

/** Reads the shared settings out of a parsed environment. */
export function runtimeSettings(prefix: string, env: Record<string, unknown>): RuntimeSettings {
  const get = <T>(key: string) => env[`${prefix}_${key}`] as T;
  const inMesh = env['INFERMESH_MESH_CONTROL_PLANE'] !== undefined;
  const sidecarPort = env['INFERMESH_SIDECAR_PORT'] as number | undefined;
  const problems: string[] = [];
  if (env['INFERMESH_TLS_DIR'] !== undefined && !inMesh) {
    // Who may call what is the mesh policy's to say, and it comes from the control plane.
    problems.push(
      'INFERMESH_TLS_DIR: mutual TLS needs the mesh (INFERMESH_MESH_CONTROL_PLANE), whose policy says which service may call which',
    );
  }
  if (sidecarPort !== undefined && !inMesh) {
    // The sidecar's listeners, clusters and policy come over xDS from the control plane, which learns
    // where this instance is from its announcement: without it, no one routes to the sidecar.
    problems.push(
      'INFERMESH_SIDECAR_PORT: the sidecar takes its configuration from the mesh control plane the service announces itself to: set INFERMESH_MESH_CONTROL_PLANE too',
    );
  }
  if (sidecarPort !== undefined && sidecarPort === get<number>('GRPC_PORT')) {
    problems.push(
      `INFERMESH_SIDECAR_PORT: ${sidecarPort} is also ${prefix}_GRPC_PORT: the sidecar and the service it forwards to cannot both listen on one port`,
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return {
    grpc: { host: get('GRPC_HOST'), port: get('GRPC_PORT') },
    metrics: { host: get('METRICS_HOST'), port: get('METRICS_PORT') },
    logLevel: get('LOG_LEVEL'),
    shutdownGraceMs: get('SHUTDOWN_GRACE_MS'),
    maxMessageBytes: get('MAX_MESSAGE_BYTES'),
    mesh:
      env['INFERMESH_MESH_CONTROL_PLANE'] === undefined
        ? undefined
        : {
            controlPlane: env['INFERMESH_MESH_CONTROL_PLANE'] as string,
            instanceId: env['INFERMESH_INSTANCE_ID'] as string | undefined,
            address: env['INFERMESH_INSTANCE_ADDRESS'] as string | undefined,
            labels: (env['INFERMESH_INSTANCE_LABELS'] as Record<string, string> | undefined) ?? {},
            heartbeatMs: env['INFERMESH_HEARTBEAT_MS'] as number,
            sidecarPort,
          },
    tls: tlsSettings(env),
    metricsToken: env['INFERMESH_METRICS_TOKEN'] as string | undefined,
    tracing: tracingSettings(env),
  };
}

/** The mutual TLS settings of a parsed environment (tlsShape); undefined without INFERMESH_TLS_DIR. */
export function tlsSettings(env: Record<string, unknown>): TransportSecurity | undefined {
  const dir = env['INFERMESH_TLS_DIR'] as string | undefined;
  if (dir === undefined) return undefined;
  return {
    certFile: join(dir, 'cert.pem'),
    keyFile: join(dir, 'key.pem'),
    caFile: join(dir, 'ca.pem'),
    trustDomain: env['INFERMESH_TRUST_DOMAIN'] as string,
    refreshMs: env['INFERMESH_TLS_REFRESH_MS'] as number,
  };
}

/** Whether the service runs behind an Envoy sidecar (INFERMESH_SIDECAR_PORT), which secures, authorizes and faults its calls. */
export function behindSidecar(settings: RuntimeSettings): boolean {
  return settings.mesh?.sidecarPort !== undefined;
}

/**
 * The transport security of the whole process (configureTransportSecurity): its identity, except
 * behind a sidecar, where it speaks plaintext to the sidecar on loopback and answers the kubelet's
 * gRPC probes without a certificate.
 */
export function processTransportSecurity(settings: RuntimeSettings): TransportSecurity | undefined {
  return behindSidecar(settings) ? undefined : settings.tls;
}

/**
 * What the service's own gRPC server does to the calls it receives: in the mesh, the faults its
 * inbound listener says, and with mutual TLS its authorization (not on a public port, whose callers
 * have no mesh identity). Behind a sidecar, neither: the sidecar's inbound listener does both, and
 * doing them again here would inject the faults twice and refuse the sidecar's plaintext calls.
 */
export function ownInboundFilters(
  settings: RuntimeSettings,
  publicGrpc: boolean,
): { faultInjection: boolean; authorization: boolean } {
  if (behindSidecar(settings)) return { faultInjection: false, authorization: false };
  return { faultInjection: settings.mesh !== undefined, authorization: settings.tls !== undefined && !publicGrpc };
}
