import { exitOnUnsupportedNode } from '@infermesh/config';
import { resolve } from 'node:path';
import { runCli } from './cli';

exitOnUnsupportedNode('infermesh');

// The `infermesh` command: tools/cli/infermesh.js runs this file once built.
runCli(process.argv.slice(2), {
  env: process.env,
  stdout: process.stdout,
  stderr: process.stderr,
  distDir: resolve(__dirname, '..', '..', '..'),
}).then(
  (code) => {
    // Exits once what was written has been flushed, even to a pipe.
    process.stdout.write('', () => process.exit(code));
  },
  (error: unknown) => {
    process.stderr.write(`infermesh: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(1);
  },
);
