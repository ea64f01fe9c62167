/**
 * The Node.js major version infermesh runs on (package.json `engines.node`; a spec keeps the two
 * equal). Older ones are end-of-life and untested here, so every program refuses them at start-up
 * instead of running on without a word.
 */
export const REQUIRED_NODE_MAJOR = 24;

/** Why `program` must not run on this Node.js, in one line; undefined when the version is supported. */
export function unsupportedNodeReason(program: string, version: string = process.versions.node): string | undefined {
  const major = Number(version.split('.')[0]);
  if (Number.isInteger(major) && major >= REQUIRED_NODE_MAJOR) return undefined;
  return (
    `${program} needs Node.js ${REQUIRED_NODE_MAJOR} or newer, and this is Node.js ${version}: ` +
    `run it through npm (npm start, npx infermesh ...), which uses the node@${REQUIRED_NODE_MAJOR} ` +
    `installed by npm ci, or install Node.js ${REQUIRED_NODE_MAJOR} (see .nvmrc).`
  );
}

/** Writes the reason on stderr and exits with 1 when this Node.js is too old; returns otherwise. */
export function exitOnUnsupportedNode(program: string): void {
  const reason = unsupportedNodeReason(program);
  if (reason === undefined) return;
  process.stderr.write(`${reason}\n`);
  process.exit(1);
}
