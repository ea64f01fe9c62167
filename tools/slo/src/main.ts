import { resolve } from 'node:path';
import { SLO_DIR, writeSloFiles } from './slo-files';
import { SloSpecError } from './slo-spec';

// Regenerates grafana/slo/rules.yaml and grafana/slo/tests/*.yaml from grafana/slo/slos.yaml:
//   npx nx run slo:generate   (npm run build && node dist/tools/slo/src/main.js [--dir grafana/slo])
const args = process.argv.slice(2);
const at = args.indexOf('--dir');
const dir = resolve(at >= 0 && args[at + 1] !== undefined ? args[at + 1]! : SLO_DIR);
try {
  const { written, deleted } = writeSloFiles(dir);
  for (const path of written) process.stdout.write(`wrote ${path}\n`);
  for (const path of deleted) process.stdout.write(`deleted ${path}\n`);
  if (written.length + deleted.length === 0) process.stdout.write(`${dir}: up to date\n`);
} catch (error) {
  process.stderr.write(
    `slo: ${error instanceof SloSpecError ? error.message : error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
  );
  process.exitCode = 1;
}
