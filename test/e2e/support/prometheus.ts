import { SERVICE_NAMES, type ServiceName } from '@infermesh/system';
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';

/** Debian's prometheus package (2.42); PROMETHEUS_BIN overrides. The test fails without it: it never skips. */
export const PROMETHEUS_BIN = process.env['PROMETHEUS_BIN'] ?? '/usr/bin/prometheus';

export interface PromResponse<T> {
  status: 'success' | 'error';
  data?: T;
  errorType?: string;
  error?: string;
  warnings?: string[];
}

export interface QueryData {
  resultType: 'vector' | 'matrix' | 'scalar' | 'string';
  result: unknown;
}

export interface Target {
  labels: Record<string, string>;
  scrapeUrl: string;
  health: 'up' | 'down' | 'unknown';
  lastError: string;
}

/** A running Prometheus on a free port, its temp directory (config, TSDB, log) and how to stop it. */
export interface Prometheus {
  url: string;
  dir: string;
  process: ChildProcess;
  logTail(lines?: number): string;
}

/** Fails, never skips, when the prometheus binary is missing. */
export function requirePrometheus(): void {
  if (!existsSync(PROMETHEUS_BIN)) {
    throw new Error(
      `Prometheus is not installed: ${PROMETHEUS_BIN} does not exist. This test runs against a live Prometheus ` +
        `and never skips: install Debian's prometheus package (apt-get install prometheus, 2.42) or set PROMETHEUS_BIN.`,
    );
  }
}

/** Prometheus scraping each service's metrics port every second as job infermesh-<service>, with `ruleFiles` loaded. */
export function startPrometheus(
  dir: string,
  port: number,
  targets: Readonly<Record<ServiceName, number>>,
  ruleFiles: readonly string[] = [],
): Prometheus {
  requirePrometheus();
  const config = {
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: ruleFiles,
    scrape_configs: SERVICE_NAMES.map((service) => ({
      job_name: `infermesh-${service}`,
      metrics_path: '/metrics',
      static_configs: [{ targets: [`127.0.0.1:${targets[service]}`] }],
    })),
  };
  const configFile = join(dir, 'prometheus.yml');
  writeFileSync(configFile, stringify(config));
  const logFile = join(dir, 'prometheus.log');
  const log = openSync(logFile, 'a');
  const child = spawn(
    PROMETHEUS_BIN,
    [
      `--config.file=${configFile}`,
      `--storage.tsdb.path=${join(dir, 'tsdb')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=info',
    ],
    { stdio: ['ignore', log, log] },
  );
  closeSync(log);
  return {
    url: `http://127.0.0.1:${port}`,
    dir,
    process: child,
    logTail: (lines = 30) => {
      try {
        return readFileSync(logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
      } catch {
        return '(no log)';
      }
    },
  };
}

export async function stopPrometheus(prometheus: Prometheus): Promise<void> {
  const child = prometheus.process;
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }
}

export async function promGet<T>(prometheus: Prometheus, path: string): Promise<PromResponse<T>> {
  const res = await fetch(`${prometheus.url}${path}`, { signal: AbortSignal.timeout(10_000) });
  return (await res.json()) as PromResponse<T>;
}

/** An instant query at `time` (now), through Prometheus' HTTP API. */
export async function query(
  prometheus: Prometheus,
  expr: string,
  time = Date.now() / 1000,
): Promise<PromResponse<QueryData>> {
  const res = await fetch(`${prometheus.url}/api/v1/query`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ query: expr, time: time.toFixed(3) }),
    signal: AbortSignal.timeout(10_000),
  });
  return (await res.json()) as PromResponse<QueryData>;
}

/** Thrown by a waitFor probe: waiting longer cannot help. */
export class Hopeless extends Error {}

/** Polls `probe` until it returns a value; its errors count as not yet, but a Hopeless one, which fails at once. */
export async function waitFor<T>(
  what: string,
  timeoutMs: number,
  probe: () => Promise<T | undefined>,
  explain: () => Promise<string> | string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = await probe().catch((error: unknown) => {
      if (error instanceof Hopeless) throw new Error(`${what}: ${error.message}`);
      return undefined;
    });
    if (found !== undefined) return found;
    if (Date.now() > deadline) throw new Error(`${what} not within ${timeoutMs} ms: ${await explain()}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * How each job's scrapes went over the last `seconds`: scrapes made, how many failed (a scrape that
 * runs past scrape_timeout fails, and a counter that appeared since the last good scrape is then not
 * in Prometheus), and the longest one. A line for the test's log.
 */
export async function scrapeHealth(prometheus: Prometheus, seconds: number): Promise<string> {
  const window = `${Math.ceil(seconds)}s`;
  const byJob = async (expr: string) =>
    new Map(
      (
        ((await query(prometheus, expr)).data?.result ?? []) as {
          metric: Record<string, string>;
          value: [number, string];
        }[]
      ).map((r) => [r.metric['job'] ?? '?', Number(r.value[1])]),
    );
  const made = await byJob(`count_over_time(up[${window}])`);
  const good = await byJob(`sum_over_time(up[${window}])`);
  const longest = await byJob(`max_over_time(scrape_duration_seconds[${window}])`);
  const jobs = [...made.keys()].sort();
  return `scrapes over the last ${window}: ${jobs
    .map(
      (job) =>
        `${job} ${made.get(job)} (${(made.get(job) ?? 0) - (good.get(job) ?? 0)} failed, longest ${((longest.get(job) ?? 0) * 1000).toFixed(0)} ms)`,
    )
    .join(', ')}`;
}
