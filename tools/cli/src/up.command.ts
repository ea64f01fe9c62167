import { DEMO_MODELS } from '@infermesh/model-builder';
import {
  DEFAULT_RESTART_POLICY,
  REPLICATED_SERVICES,
  type ReplicatedService,
  SERVICE_NAMES,
  type ServiceName,
  System,
  defaultPorts,
  describeSupervisionEvent,
} from '@infermesh/system';
import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { parseReplicas } from './args';
import type { CliConfig } from './cli.config';
import { UsageError } from './cli-errors';

const COLORS = [36, 33, 35, 32, 34, 31];
const width = Math.max(...SERVICE_NAMES.map((n) => n.length));

function prefixer(color: boolean) {
  return (service: ServiceName, line: string) => {
    const label = service.padEnd(width);
    const code = COLORS[SERVICE_NAMES.indexOf(service) % COLORS.length];
    process.stdout.write(color ? `\x1b[${code}m${label} |\x1b[0m ${line}\n` : `${label} | ${line}\n`);
  };
}

/** What `up` starts besides its configuration: how many workers, and instances of the router, batcher and cache. */
export interface UpOptions {
  workers: number;
  replicas: Partial<Record<ReplicatedService, number>>;
}

/** The most instances of one service `up` starts on one machine. */
export const MAX_REPLICAS = 8;

/**
 * `--replicas`: workers always; the router, batcher and cache only in the mesh (INFERMESH_MESH=xds),
 * where their callers reach every instance; the registry and the gateway never (one control plane,
 * one front door on this machine).
 */
export function upOptions(replicas: string | undefined, mesh: 'static' | 'xds' = 'xds'): UpOptions {
  if (replicas === undefined) return { workers: 1, replicas: {} };
  const counts = parseReplicas(replicas, '--replicas', SERVICE_NAMES, MAX_REPLICAS);
  const single = [...counts]
    .filter(([service, n]) => (service === 'registry' || service === 'gateway') && n > 1)
    .map(([service]) => service);
  if (single.length > 0)
    throw new UsageError(
      `--replicas: ${single.join(', ')} run once on one machine (the control plane, the front door)`,
    );
  const needMesh = [...counts]
    .filter(([service, n]) => (REPLICATED_SERVICES as readonly string[]).includes(service) && n > 1)
    .map(([service]) => service);
  if (needMesh.length > 0 && mesh !== 'xds') {
    throw new UsageError(
      `--replicas: ${needMesh.join(', ')} replicas need the mesh, through which their callers reach every instance: set INFERMESH_MESH=xds; workers can have replicas either way (worker=2)`,
    );
  }
  return {
    workers: counts.get('worker') ?? 1,
    replicas: Object.fromEntries(REPLICATED_SERVICES.filter((s) => counts.has(s)).map((s) => [s, counts.get(s)!])),
  };
}

/**
 * `infermesh up`: starts the six services as processes on this machine (embedded stores, or Redis
 * when REDIS_URL is set), registers the demo models, waits until the gateway is ready, prints how to
 * call it, and stops everything cleanly on Ctrl-C. A service that exits unexpectedly is restarted
 * with exponential back-off until it crash-loops (DEFAULT_RESTART_POLICY).
 */
export async function up(
  config: CliConfig,
  distDir: string,
  options: UpOptions = { workers: 1, replicas: {} },
): Promise<void> {
  const generated = config.apiKey === undefined;
  const apiKey = config.apiKey ?? `im_${randomBytes(24).toString('base64url')}`;
  const unknown = config.demoModels.filter((m) => !(m in DEMO_MODELS));
  if (unknown.length > 0) {
    throw new Error(
      `INFERMESH_DEMO_MODELS: unknown model(s) ${unknown.join(', ')}; known: ${Object.keys(DEMO_MODELS).join(', ')}`,
    );
  }
  const models = config.demoModels.map((name) => {
    const built = DEMO_MODELS[name]!();
    return { name, version: '1', bytes: built.bytes, processing: built.processing, batching: built.batching };
  });
  const started = Date.now();
  const ports = defaultPorts(options.workers, options.replicas);
  let shuttingDown = false;
  const system = new System({
    distDir,
    dataDir: resolve(config.dataDir),
    apiKey,
    redisUrl: config.redisUrl,
    ports,
    workers: Array.from({ length: options.workers }, () => ({})),
    replicas: Object.fromEntries(
      Object.entries(options.replicas).map(([s, n]) => [s, Array.from({ length: n }, () => ({}))]),
    ),
    host: config.host,
    sink: prefixer(process.stdout.isTTY),
    env: Object.fromEntries(SERVICE_NAMES.map((n) => [`${n.toUpperCase()}_LOG_LEVEL`, config.logLevel])),
    models,
    readyTimeoutMs: config.readyTimeoutMs,
    // A service that crashes is started again, as a kubelet would, and the reason logged each time.
    restartPolicy: DEFAULT_RESTART_POLICY,
    mesh:
      config.mesh === 'xds'
        ? { policyFile: resolve(config.meshPolicy ?? join(distDir, '..', 'envoy', 'mesh.yaml')) }
        : undefined,
    mtls: config.mtls ? { lifetimeMs: config.identityLifetimeMs } : undefined,
    onIdentity: (event) => {
      if ('error' in event)
        process.stderr.write(
          `infermesh: the certificate of ${event.instance} could not be issued again (retrying): ${event.error.message}\n`,
        );
    },
    onSupervision: (name, event, instance) => {
      if (!shuttingDown)
        process.stderr.write(
          `infermesh: ${describeSupervisionEvent(instance === undefined ? name : `${name} ${instance}`, event)}\n`,
        );
    },
  });
  // Ctrl-C stops everything cleanly, also while the system is still starting.
  const stopped = new Promise<void>((resolveStop) => {
    const onSignal = () => {
      if (shuttingDown) return;
      shuttingDown = true;
      process.stdout.write('\ninfermesh: stopping...\n');
      system.stop().then(
        () => resolveStop(),
        () => resolveStop(),
      );
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });
  try {
    await system.start();
  } catch (error) {
    if (shuttingDown) {
      await stopped;
      process.stdout.write('infermesh: stopped\n');
      return;
    }
    throw error;
  }

  const url = system.gatewayUrl;
  const example = config.demoModels.includes('tiny') ? 'tiny' : config.demoModels[0];
  const body =
    example === 'tiny'
      ? `'{"inputs":[{"name":"input","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'`
      : `'{"inputs":[...]}'`;
  process.stdout.write(
    [
      '',
      `infermesh is ready in ${((Date.now() - started) / 1000).toFixed(1)} s (${config.redisUrl === undefined ? 'embedded stores' : 'Redis'}${config.mesh === 'xds' ? `, through the mesh (xDS from the registry${config.mtls ? ', mutual TLS' : ''})` : ''})`,
      `  REST     ${url}  (KServe v2 / Open Inference Protocol)`,
      `  gRPC     ${system.gatewayGrpcAddress}  (inference.GRPCInferenceService)`,
      `  metrics  http://${config.host}:${ports.gatewayMetrics}/metrics (gateway; other services on 9101-9105${[...(ports.moreWorkers ?? []), ...Object.values(ports.moreReplicas ?? {}).flat()].map((w) => `, ${w.metrics}`).join('')})`,
      ...(options.workers > 1
        ? [
            `  workers  ${options.workers}: gRPC ${[ports.worker, ...(ports.moreWorkers ?? []).map((w) => w.grpc)].join(', ')}`,
          ]
        : []),
      ...Object.entries(ports.moreReplicas ?? {}).map(
        ([s, more]) =>
          `  ${s.padEnd(7)}  ${more.length + 1}: gRPC ${[ports[s as ReplicatedService], ...more.map((p) => p.grpc)].join(', ')}`,
      ),
      ...(config.tracing === undefined
        ? []
        : [`  traces   OTLP to ${config.tracing.tracesUrl}, ${describeSampling(config.tracing)}`]),
      `  models   ${config.demoModels.join(', ')}`,
      `  API key  ${apiKey}${generated ? '   (generated; set INFERMESH_API_KEY to choose one)' : ''}`,
      '',
      'Try:',
      `  curl -s -H "Authorization: Bearer ${apiKey}" -X POST ${url}/v2/repository/index`,
      `  curl -s -H "Authorization: Bearer ${apiKey}" ${url}/v2/models/${example}`,
      `  curl -s -H "Authorization: Bearer ${apiKey}" -H 'content-type: application/json' \\`,
      `       -X POST ${url}/v2/models/${example}/infer -d ${body}`,
      '',
      'Press Ctrl-C to stop.',
      '',
    ].join('\n'),
  );

  await stopped;
  process.stdout.write('infermesh: stopped\n');
}

/** The sampling the services apply, in words. */
function describeSampling(tracing: NonNullable<CliConfig['tracing']>): string {
  const share = `${+(tracing.ratio * 100).toPrecision(3)} % of new traces`;
  return tracing.parentBased ? `${share}, a caller's decision followed` : share;
}
