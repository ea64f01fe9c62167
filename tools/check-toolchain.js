#!/usr/bin/env node
// Fails loudly, before anything runs, when the test suite's real dependencies are missing.
'use strict';
const { spawnSync } = require('node:child_process');

const problems = [];
const major = Number(process.versions.node.split('.')[0]);
if (major < 24) {
  problems.push(
    `Node ${process.version} is running, infermesh needs Node 24: run through npm (npm test / npm start), ` +
      'which puts the node@24 devDependency from node_modules/.bin first on PATH, after `npm ci`.',
  );
}
const redis = spawnSync('redis-server', ['--version'], { encoding: 'utf8' });
if (redis.error !== undefined || redis.status !== 0) {
  problems.push('redis-server is not installed: the tests start a real one. Install it with `apt-get install redis-server`.');
}
const promtool = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
if (promtool.error !== undefined || promtool.status !== 0) {
  problems.push('promtool is not installed: the tests check the SLO rules (grafana/slo) with it. Install it with `apt-get install prometheus`.');
}
const kubectl = spawnSync('kubectl', ['kustomize', 'k8s/overlays/local'], { encoding: 'utf8', cwd: require('node:path').join(__dirname, '..') });
if (kubectl.error !== undefined) {
  problems.push('kubectl is not installed: the tests render k8s/ with `kubectl kustomize`. Install it with `apt-get install kubernetes-client` (or any kubectl of 1.21 or later).');
} else if (kubectl.status !== 0) {
  problems.push(`\`kubectl kustomize k8s/overlays/local\` failed (a kubectl older than 1.21 has no kustomize components): ${kubectl.stderr.trim().split('\n')[0]}`);
}
if (problems.length > 0) {
  process.stderr.write(`missing test dependencies:\n${problems.map((p) => `  - ${p}`).join('\n')}\n`);
  process.exit(1);
}
