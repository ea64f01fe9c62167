import { tuneHeapForTensors } from '@infermesh/config';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../../e2e/support/system-fixture';
import { batching } from './batching.scenario';
import { cache } from './cache.scenario';
import { carried } from './carried.scenario';
import { gateway } from './gateway.scenario';
import { latency } from './latency.scenario';
import { mesh } from './mesh.scenario';
import { path } from './path.scenario';
import { quantization } from './quantization.scenario';
import { tracing } from './tracing.scenario';
import { worker } from './worker.scenario';

// The load generator carries tensors too, on the cores it shares with the services: it runs with the
// services' V8 settings (counting their buffers within the heap's limit, and the same headroom of
// garbage), so that its garbage collections (0.4 to 1.0 ms of CPU per call of batch-32 MLP tensors
// without the first, in V8's own threads) take as little of those cores as they can.
tuneHeapForTensors();

/** Benchmark scenarios by name: each runs against real processes and returns its figures. */
const SCENARIOS: Record<string, () => Promise<Record<string, unknown>>> = {
  latency,
  worker,
  batching,
  cache,
  gateway,
  mesh,
  tracing,
  quantization,
  path,
  carried,
};

/**
 * The result as one flat JSON object, the benchmark's last line: a nested object's figures under
 * their path joined by '_' (overload.capacity_rps: overload_capacity_rps); lists (per-point tables)
 * are left to the results file.
 */
function flatFigures(value: Record<string, unknown>, prefix = ''): Record<string, unknown> {
  const flat: Record<string, unknown> = {};
  for (const [key, figure] of Object.entries(value)) {
    if (Array.isArray(figure)) continue;
    if (figure !== null && typeof figure === 'object') {
      Object.assign(flat, flatFigures(figure as Record<string, unknown>, `${prefix}${key}_`));
    } else {
      flat[`${prefix}${key}`] = figure;
    }
  }
  return flat;
}

async function main(): Promise<number> {
  const name = process.argv[2];
  if (name === undefined || !(name in SCENARIOS)) {
    process.stderr.write(`usage: npm run bench -- <scenario>\nscenarios: ${Object.keys(SCENARIOS).join(', ')}\n`);
    return 2;
  }
  const result = { ...(await SCENARIOS[name]!()), node: process.version, measured_at: new Date().toISOString() };
  const dir = join(REPO_ROOT, 'test', 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  process.stdout.write(`\nwrote ${file}\n${JSON.stringify(flatFigures(result))}\n`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`bench failed: ${error instanceof Error ? error.stack : String(error)}\n`);
    process.exit(1);
  },
);
