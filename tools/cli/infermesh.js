#!/usr/bin/env node
// The `infermesh` command (package.json "bin"): runs the compiled CLI. `npm run build` compiles it.
'use strict';
const path = require('node:path');
const fs = require('node:fs');

const entry = path.join(__dirname, '..', '..', 'dist', 'tools', 'cli', 'src', 'main.js');
if (!fs.existsSync(entry)) {
  process.stderr.write('infermesh is not built yet: run `npm run build` (or `npm start`) in the repository first.\n');
  process.exit(1);
}
require(entry);
