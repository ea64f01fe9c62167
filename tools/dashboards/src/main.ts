// Writes every board to grafana/dashboards/<uid>.json (and deletes board files the code no longer
// makes); with --check, writes nothing and exits 1 when a file differs from the code.
//   npx nx run dashboards:generate            (compiles this project alone, then runs it)
//   node dist/tools/dashboards/src/main.js [--check] [--out DIR]
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { renderAll } from './dashboards';

/** The workspace root: the nearest folder above this file that holds nx.json (from src/ or from dist/). */
export function workspaceRoot(from = __dirname): string {
  for (let dir = resolve(from); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'nx.json'))) return dir;
    if (dirname(dir) === dir) throw new Error(`no nx.json above ${from}`);
  }
}

export const DASHBOARDS_DIR = join('grafana', 'dashboards');

export interface Drift {
  /** Files that differ from the code, or are missing. */
  changed: string[];
  /** Board files the code no longer makes. */
  stale: string[];
}

/** Compares the files in `dir` with the boards the code makes. */
export function drift(dir: string): Drift {
  const files = renderAll();
  const made = new Set(files.map((f) => f.fileName));
  const present = existsSync(dir) ? readdirSync(dir).filter((name) => name.endsWith('.json')) : [];
  return {
    changed: files
      .filter((f) => !existsSync(join(dir, f.fileName)) || readFileSync(join(dir, f.fileName), 'utf8') !== f.text)
      .map((f) => f.fileName),
    stale: present.filter((name) => !made.has(name)).sort(),
  };
}

/** Writes the boards to `dir`, deletes stale board files there, and returns what it changed. */
export function writeDashboards(dir: string): Drift {
  const found = drift(dir);
  mkdirSync(dir, { recursive: true });
  for (const file of renderAll())
    if (found.changed.includes(file.fileName)) writeFileSync(join(dir, file.fileName), file.text);
  for (const name of found.stale) rmSync(join(dir, name));
  return found;
}

function main(argv: string[]): number {
  const check = argv.includes('--check');
  const outAt = argv.indexOf('--out');
  const root = workspaceRoot();
  const dir = outAt >= 0 && argv[outAt + 1] !== undefined ? resolve(argv[outAt + 1]!) : join(root, DASHBOARDS_DIR);
  const shown = relative(process.cwd(), dir) || '.';
  if (check) {
    const { changed, stale } = drift(dir);
    if (changed.length === 0 && stale.length === 0) {
      process.stdout.write(`${shown}: every board matches the code\n`);
      return 0;
    }
    for (const name of changed) process.stderr.write(`${shown}/${name}: differs from the code\n`);
    for (const name of stale) process.stderr.write(`${shown}/${name}: no board in the code makes it\n`);
    process.stderr.write('regenerate with `npx nx run dashboards:generate`\n');
    return 1;
  }
  const { changed, stale } = writeDashboards(dir);
  for (const name of changed) process.stdout.write(`wrote ${shown}/${name}\n`);
  for (const name of stale) process.stdout.write(`deleted ${shown}/${name}\n`);
  if (changed.length === 0 && stale.length === 0) process.stdout.write(`${shown}: up to date\n`);
  return 0;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));
