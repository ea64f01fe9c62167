import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RULES_FILE, SLO_DIR, TESTS_DIR } from './slo-files';

// The rules and their unit tests, run by Prometheus' own promtool (Debian's `prometheus` package).
// Without promtool these tests fail: they are never skipped.

const DIR = join(__dirname, '..', '..', '..', SLO_DIR);
const TEST_FILES = readdirSync(join(DIR, TESTS_DIR))
  .filter((f) => f.endsWith('.yaml'))
  .sort();
const MISSING =
  "promtool is not installed: the SLO rules are checked with Prometheus' promtool. Install it with `apt-get install prometheus` " +
  '(Debian; it provides /usr/bin/promtool), or put a promtool from https://prometheus.io/download/ on PATH.';

interface Run {
  code: number;
  output: string;
}

/** Runs promtool; rejects only when it cannot be started. */
function promtool(args: readonly string[], cwd: string): Promise<Run> {
  return new Promise((resolve, reject) => {
    execFile('promtool', args, { cwd, maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error !== null && (error as NodeJS.ErrnoException).code === 'ENOENT') reject(new Error(MISSING));
      else
        resolve({
          code: error === null ? 0 : typeof error.code === 'number' ? error.code : 1,
          output: `${stdout}${stderr}`,
        });
    });
  });
}

/** Fails with promtool's own output when it did not succeed. */
function expectSuccess(run: Run, command: string): void {
  if (run.code !== 0) throw new Error(`\`${command}\` in ${SLO_DIR} failed (exit ${run.code}):\n${run.output}`);
}

describe('promtool', () => {
  it('is installed', async () => {
    const run = await promtool(['--version'], DIR);

    expect(run.output).toMatch(/promtool, version \d+\./);
  });

  it(`check rules ${RULES_FILE}: the rules are valid`, async () => {
    const run = await promtool(['check', 'rules', RULES_FILE], DIR);

    expectSuccess(run, `promtool check rules ${RULES_FILE}`);
    expect(run.output).toMatch(/SUCCESS: \d+ rules found/);
  });

  it('finds the unit tests', () => {
    expect(TEST_FILES.length).toBeGreaterThanOrEqual(7);
  });

  const rules = readFileSync(join(DIR, RULES_FILE), 'utf8');
  /** Broken copies of rules.yaml: [what breaks, this, replaced by that, the test file that must fail, naming this alert]. */
  const broken: [string, string | RegExp, string, string, string][] = [
    [
      'the fast page burn rate raised from 14.4× to 14.5×',
      '(14.4 * 0.005)',
      '(14.5 * 0.005)',
      'slo-each-model-availability.yaml',
      'InfermeshEachModelAvailabilityBudgetBurn',
    ],
    [
      'the slowest ticket burn rate lowered from 1× to 0.99×',
      '(1 * 0.01)',
      '(0.99 * 0.01)',
      'slo-all-latency.yaml',
      'InfermeshAllLatencyBudgetBurn',
    ],
    [
      'the 5m short window replaced by the 1h window',
      ':ratio_rate5m{model!~',
      ':ratio_rate1h{model!~',
      'slo-each-model-availability.yaml',
      'InfermeshEachModelAvailabilityBudgetBurn',
    ],
    [
      'deadline_exceeded no longer an error',
      '|deadline_exceeded|',
      '|',
      'slo-each-model-availability.yaml',
      'InfermeshEachModelAvailabilityBudgetBurn',
    ],
    [
      "invalid_argument (the client's) counted as an error",
      'outcome=~"unavailable|',
      'outcome=~"invalid_argument|unavailable|',
      'slo-model-classifier-availability.yaml',
      'InfermeshModelClassifierAvailabilityBudgetBurn',
    ],
    [
      'the latency SLI reading the next bucket',
      /le="0\.25"/g,
      'le="0.5"',
      'slo-each-model-latency.yaml',
      'InfermeshEachModelLatencyBudgetBurn',
    ],
    [
      'admin endpoints timed as inference',
      'endpoint=~"ModelInfer|',
      'endpoint=~"GET /admin/v1/models|ModelInfer|',
      'slo-all-latency.yaml',
      'InfermeshAllLatencyBudgetBurn',
    ],
    [
      'classifier judged by the objective of each model too',
      'model!~"classifier|',
      'model!~"',
      'slo-each-model-availability.yaml',
      'InfermeshEachModelAvailabilityBudgetBurn',
    ],
    [
      'the queue alert at 801 instead of 800',
      'infermesh_batcher_queue_depth >= 800',
      'infermesh_batcher_queue_depth >= 801',
      'operations.yaml',
      'InfermeshBatcherQueueNearBound',
    ],
    [
      'the memory alert at 94.9 % instead of 95 %',
      '>= 0.95',
      '>= 0.949',
      'operations.yaml',
      'InfermeshWorkerMemoryBudgetExhausted',
    ],
    [
      'a service without targets no longer down',
      /\n\s*or absent\(up\{job="infermesh-cache"\}\)/,
      '',
      'operations.yaml',
      'InfermeshServiceDown',
    ],
    [
      'the registry watch alert at 301 s',
      'registry_watch_config_age_seconds"} >= 300',
      'registry_watch_config_age_seconds"} >= 301',
      'operations.yaml',
      'InfermeshRegistryWatchDisconnected',
    ],
  ];

  // Every test file, and each broken copy in a scratch directory of its own, runs at once (each
  // takes seconds); each is reported on its own.
  const runs = new Map<string, Promise<Run>>();
  let scratch: string;
  beforeAll(() => {
    for (const file of TEST_FILES) runs.set(file, promtool(['test', 'rules', join(TESTS_DIR, file)], DIR));
    scratch = mkdtempSync(join(tmpdir(), 'infermesh-slo-'));
    for (const [what, from, to, file] of broken) {
      const text = typeof from === 'string' ? rules.replaceAll(from, to) : rules.replace(from, to);
      if (text === rules) {
        runs.set(what, Promise.reject(new Error(`${RULES_FILE} holds no ${String(from)} to break: update this case`)));
      } else {
        const dir = mkdtempSync(join(scratch, 'case-'));
        writeFileSync(join(dir, RULES_FILE), text);
        cpSync(join(DIR, TESTS_DIR, file), join(dir, TESTS_DIR, file));
        runs.set(what, promtool(['test', 'rules', join(TESTS_DIR, file)], dir));
      }
    }
    for (const run of runs.values()) run.catch(() => undefined);
  });
  afterAll(async () => {
    await Promise.allSettled(runs.values());
    rmSync(scratch, { recursive: true, force: true });
  });
  const runOf = (key: string) => runs.get(key)!;

  it.each(TEST_FILES)(
    `test rules ${TESTS_DIR}/%s: every alert fires at its threshold, and not below it`,
    async (file) => {
      const run = await runOf(file);

      expectSuccess(run, `promtool test rules ${TESTS_DIR}/${file}`);
      expect(run.output).toContain('SUCCESS');
    },
    120_000,
  );

  describe('the unit tests fail when the rules are broken', () => {
    it.each(broken)(
      '%s',
      async (what, _from, _to, _file, alertname) => {
        const run = await runOf(what);

        expect(run.code).not.toBe(0);
        expect(run.output).toContain(`alertname: ${alertname}`);
      },
      120_000,
    );
  });
});
