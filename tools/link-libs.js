#!/usr/bin/env node
// Makes `@infermesh/<lib>` resolvable from a compiled output (dist/ by default, or the folder named by
// the first argument, e.g. dist-test): <out>/node_modules/@infermesh/<lib> links to <out>/libs/<lib>/src,
// mirroring the `paths` mapping in tsconfig.base.json. Libraries an output does not hold get no link.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const out = path.resolve(root, process.argv[2] ?? 'dist');
const scope = path.join(out, 'node_modules', '@infermesh');
fs.mkdirSync(scope, { recursive: true });
for (const lib of fs.readdirSync(path.join(root, 'libs'))) {
  const target = path.join(out, 'libs', lib, 'src');
  const link = path.join(scope, lib);
  fs.rmSync(link, { recursive: true, force: true });
  if (!fs.existsSync(target)) continue;
  fs.symlinkSync(path.relative(scope, target), link, 'dir');
}
