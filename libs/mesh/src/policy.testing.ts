import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import { type MeshPolicy, parseMeshPolicy } from './mesh-policy';

/** The shipped policy's text (envoy/mesh.yaml), for specs. */
export const SHIPPED_POLICY = readFileSync(join(__dirname, '..', '..', '..', 'envoy', 'mesh.yaml'), 'utf8');

/** The shipped policy with values set at paths (undefined: the path removed), parsed. */
export function policyWith(...changes: [path: (string | number)[], value: unknown][]): MeshPolicy {
  const doc = parseDocument(SHIPPED_POLICY);
  for (const [path, value] of changes) {
    if (value === undefined) doc.deleteIn(path);
    else doc.setIn(path, doc.createNode(value));
  }
  return parseMeshPolicy(doc.toString());
}
