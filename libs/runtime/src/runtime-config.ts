import { host, logLevel, port, positiveInt } from '@infermesh/config';

/** The settings every service shares, read from `<PREFIX>_*` variables. */
export interface RuntimeSettings {
  grpc: { host: string; port: number };
  metrics: { host: string; port: number };
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  shutdownGraceMs: number;
  maxMessageBytes: number;
}

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
  } as Record<`${P}_${'GRPC_HOST' | 'METRICS_HOST'}`, ReturnType<typeof host>> &
    Record<`${P}_${'GRPC_PORT' | 'METRICS_PORT'}`, ReturnType<typeof port>> &
    Record<`${P}_LOG_LEVEL`, ReturnType<typeof logLevel>> &
    Record<`${P}_${'SHUTDOWN_GRACE_MS' | 'MAX_MESSAGE_BYTES'}`, ReturnType<typeof positiveInt>>;
}

/** Reads the shared settings out of a parsed environment. */
export function runtimeSettings(prefix: string, env: Record<string, unknown>): RuntimeSettings {
  const get = <T>(key: string) => env[`${prefix}_${key}`] as T;
  return {
    grpc: { host: get('GRPC_HOST'), port: get('GRPC_PORT') },
    metrics: { host: get('METRICS_HOST'), port: get('METRICS_PORT') },
    logLevel: get('LOG_LEVEL'),
    shutdownGraceMs: get('SHUTDOWN_GRACE_MS'),
    maxMessageBytes: get('MAX_MESSAGE_BYTES'),
  };
}

