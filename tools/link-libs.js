#!/usr/bin/env node
// Makes `@infermesh/<lib>` resolvable from the compiled output: dist/node_modules/@infermesh/<lib>
// links to dist/libs/<lib>/src, mirroring the `paths` mapping in tsconfig.base.json.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const scope = path.join(root, 'dist', 'node_modules', '@infermesh');
fs.mkdirSync(scope, { recursive: true });
for (const lib of fs.readdirSync(path.join(root, 'libs'))) {
  const target = path.join(root, 'dist', 'libs', lib, 'src');
  if (!fs.existsSync(target)) continue;
  const link = path.join(scope, lib);
  fs.rmSync(link, { recursive: true, force: true });
  fs.symlinkSync(path.relative(scope, target), link, 'dir');
}
