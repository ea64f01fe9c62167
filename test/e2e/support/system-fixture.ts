import { type BuiltModel, DEMO_MODELS } from '@infermesh/model-builder';
import {
  REPLICATED_SERVICES,
  type ReplicaOptions,
  type ReplicatedService,
  type RestartPolicy,
  System,
  describeSupervisionEvent,
  type SystemOptions,
  type SystemPorts,
  type WorkerOptions,
} from '@infermesh/system';
import { freePortList } from '@infermesh/testing';
import { spawn } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

export const API_KEY = 'e2e-test-key-0123456789abcdef';

/** The repository root, whether this file runs from its source (jest) or from dist/ (benchmarks). */
export const REPO_ROOT = (() => {
  let dir = __dirname;
  while (!(existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'proto')))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`no repository root above ${__dirname}`);
    dir = parent;
  }
  return dir;
})();
export const DIST = join(REPO_ROOT, 'dist');

/**
 * Free ports for every service, for `workers` workers in all and `replicas` instances of the router,
 * batcher or cache (two ports each), chosen at once so that no two are the same.
 */
export async function freePorts(
  workers = 1,
  replicas: Partial<Record<ReplicatedService, number>> = {},
): Promise<SystemPorts> {
  const names = [
    'gatewayHttp',
    'gatewayGrpc',
    'gatewayMetrics',
    'registry',
    'registryMetrics',
    'router',
    'routerMetrics',
    'cache',
    'cacheMetrics',
    'batcher',
    'batcherMetrics',
    'worker',
    'workerMetrics',
    'registryXds',
  ] as const;
  const extra: Record<'worker' | ReplicatedService, number> = {
    worker: Math.max(0, workers - 1),
    router: Math.max(0, (replicas.router ?? 1) - 1),
    batcher: Math.max(0, (replicas.batcher ?? 1) - 1),
    cache: Math.max(0, (replicas.cache ?? 1) - 1),
  };
  const list = await freePortList(names.length + 2 * Object.values(extra).reduce((a, b) => a + b, 0));
  const ports = Object.fromEntries(names.map((name, i) => [name, list[i]!])) as Record<(typeof names)[number], number>;
  let next = names.length;
  const take = (count: number) =>
    Array.from({ length: count }, () => ({ grpc: list[next++]!, metrics: list[next++]! }));
  const moreWorkers = take(extra.worker);
  const moreReplicas = Object.fromEntries(
    REPLICATED_SERVICES.filter((s) => extra[s] > 0).map((s) => [s, take(extra[s])]),
  );
  return {
    ...ports,
    ...(moreWorkers.length > 0 && { moreWorkers }),
    ...(Object.keys(moreReplicas).length > 0 && { moreReplicas }),
  };
}

export interface Fixture {
  system: System;
  logFile: string;
  /** The last lines the services logged, to explain a failure. */
  logTail(lines?: number): string;
  stop(): Promise<void>;
}

/**
 * Starts the six services from dist/ as processes on free ports, with a fresh data directory, the
 * named demo models registered, and their logs in a file (printed when start-up fails).
 */
export async function startFixture(options: {
  /** Demo models by name, or models built by the test (registered under their own name). */
  models: (string | BuiltModel)[];
  redisUrl?: string;
  env?: Record<string, string>;
  /** The worker processes and the models each serves; default one worker serving every model. */
  workers?: WorkerOptions[];
  /** Restart services that exit unexpectedly, as `infermesh up` does; default: leave them stopped. */
  restartPolicy?: RestartPolicy;
  /** Run the services in the mesh with this policy file (the registry serves it over xDS); default: static addresses. */
  meshPolicyFile?: string;
  /** Instances of the router, batcher or cache (needs meshPolicyFile); default one each. */
  replicas?: Partial<Record<ReplicatedService, ReplicaOptions[]>>;
  /** Mutual TLS between the services, with identities from a local CA (needs meshPolicyFile); default plaintext. */
  mtls?: SystemOptions['mtls'];
}): Promise<Fixture> {
  const dataDir = mkdtempSync(join(tmpdir(), 'infermesh-e2e-'));
  const logFile = join(dataDir, 'services.log');
  const logTail = (lines = 60) => {
    try {
      return readFileSync(logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  };
  let system: System;
  try {
    system = await System.start({
      distDir: DIST,
      dataDir,
      apiKey: API_KEY,
      redisUrl: options.redisUrl,
      ports: await freePorts(
        options.workers?.length ?? 1,
        Object.fromEntries(Object.entries(options.replicas ?? {}).map(([s, list]) => [s, list.length])),
      ),
      ...(options.replicas !== undefined && { replicas: options.replicas }),
      sink: (service, line, instance) =>
        appendFileSync(logFile, `${service}${instance === undefined ? '' : ` ${instance}`} | ${line}\n`),
      env: options.env ?? {},
      models: options.models.map((model) => {
        const built = typeof model === 'string' ? DEMO_MODELS[model]!() : model;
        const name = typeof model === 'string' ? model : model.name;
        return { name, version: '1', bytes: built.bytes, processing: built.processing, batching: built.batching };
      }),
      readyTimeoutMs: 90_000,
      ...(options.workers !== undefined && { workers: options.workers }),
      restartPolicy: options.restartPolicy,
      mesh: options.meshPolicyFile === undefined ? undefined : { policyFile: options.meshPolicyFile },
      mtls: options.mtls,
      onIdentity: (event) =>
        appendFileSync(
          logFile,
          `supervisor | identity of ${event.instance}: ${'error' in event ? `not issued again: ${event.error.message}` : `issued, valid until ${event.notAfter.toISOString()}`}\n`,
        ),
      onSupervision: (service, event, instance) =>
        appendFileSync(
          logFile,
          `supervisor | ${describeSupervisionEvent(instance === undefined ? service : `${service} ${instance}`, event)}\n`,
        ),
    });
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n--- service logs ---\n${logTail()}`);
  }
  return {
    system,
    logFile,
    logTail,
    stop: async () => {
      await system.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** The value of a Prometheus counter sample, 0 when absent. */
export async function metricValue(url: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  return metricIn(await (await fetch(url)).text(), name, labels);
}

/** The sum of the samples of metric `name` with `labels` in one scrape's text (0 when none). */
export function metricIn(text: string, name: string, labels: Record<string, string> = {}): number {
  let total = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (match === null || match[1] !== name) continue;
    const sampleLabels = Object.fromEntries(
      [...(match[3] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]),
    );
    if (Object.entries(labels).every(([k, v]) => sampleLabels[k] === v)) total += Number(match[4]);
  }
  return total;
}

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the `infermesh` CLI the way a user does (`npx infermesh ...`) against a gateway, with the e2e admin key; killed after timeoutMs. */
export function runCli(args: readonly string[], gatewayGrpcAddress: string, timeoutMs = 120_000): Promise<CliResult> {
  return new Promise<CliResult>((resolve, reject) => {
    const child = spawn(process.execPath, [join(REPO_ROOT, 'tools', 'cli', 'infermesh.js'), ...args], {
      env: { ...process.env, INFERMESH_GATEWAY: gatewayGrpcAddress, INFERMESH_API_KEY: API_KEY },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

let distinctInput = 0;

/**
 * A request to the `tiny` model over REST that is never the same twice (the result cache cannot
 * answer it): its status, or 0 when the gateway could not be reached.
 */
export async function inferTinyDistinct(gatewayUrl: string): Promise<number> {
  distinctInput += 1;
  try {
    const res = await fetch(`${gatewayUrl}/v2/models/tiny/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [distinctInput, 1, 2, 3] }],
      }),
      signal: AbortSignal.timeout(20_000),
    });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return 0;
  }
}
