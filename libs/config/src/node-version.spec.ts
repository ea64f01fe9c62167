import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REQUIRED_NODE_MAJOR, unsupportedNodeReason } from './node-version';

describe('unsupportedNodeReason', () => {
  it('accepts the required major and newer ones', () => {
    expect(unsupportedNodeReason('gateway', `${REQUIRED_NODE_MAJOR}.0.0`)).toBeUndefined();
    expect(unsupportedNodeReason('gateway', `${REQUIRED_NODE_MAJOR}.11.1`)).toBeUndefined();
    expect(unsupportedNodeReason('gateway', `${REQUIRED_NODE_MAJOR + 1}.0.0`)).toBeUndefined();
  });

  it('refuses an older one in one line naming the program, both versions and the way out', () => {
    const reason = unsupportedNodeReason('infermesh', '20.20.2');
    expect(reason).toContain('infermesh needs Node.js 24 or newer');
    expect(reason).toContain('Node.js 20.20.2');
    expect(reason).toContain('npm');
    expect(reason).not.toContain('\n');
  });

  it('says the same version as package.json engines and .nvmrc', () => {
    const root = join(__dirname, '..', '..', '..');
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { engines: { node: string } };
    expect(pkg.engines.node).toMatch(new RegExp(`^>=${REQUIRED_NODE_MAJOR}\\b`));
    expect(readFileSync(join(root, '.nvmrc'), 'utf8').trim()).toBe(String(REQUIRED_NODE_MAJOR));
  });
});
