import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MeshPolicyFile } from './mesh-policy.file';

const SHIPPED = readFileSync(join(__dirname, '..', '..', '..', 'envoy', 'mesh.yaml'), 'utf8');

describe(MeshPolicyFile.name, () => {
  let dir: string;
  let path: string;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'mesh-policy-'));
    path = join(dir, 'mesh.yaml');
    writeFileSync(path, SHIPPED);
  });

  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('applies a change that validates, and reports nothing when the content did not change', () => {
    const sut = new MeshPolicyFile(path, 1_000);
    expect(sut.reload()).toBeUndefined();

    const edge = '    to: cache\n';
    if (!SHIPPED.includes(edge)) throw new Error('the shipped policy has no router -> cache edge');
    writeFileSync(path, SHIPPED.replace(edge, `${edge}    connectTimeout: 2s\n`));
    const change = sut.reload();

    expect(change?.kind).toBe('applied');
    expect(sut.policy.edges.find((e) => e.to === 'cache')!.connectTimeoutMs).toBe(2_000);
  });

  it('refuses a change that does not validate, naming the field, and keeps the running policy', () => {
    const sut = new MeshPolicyFile(path, 1_000);
    const running = sut.policy;

    writeFileSync(path, SHIPPED.replace('subset: next\n', 'subset: nxt\n'));
    const change = sut.reload();

    expect(change).toEqual({
      kind: 'refused',
      problems: [expect.stringContaining('router has no subset "nxt"') as unknown],
    });
    expect(sut.policy).toBe(running);
  });

  it('refuses a file that went away, and keeps the running policy', () => {
    const sut = new MeshPolicyFile(path, 1_000);
    rmSync(path);

    expect(sut.reload()).toEqual({
      kind: 'refused',
      problems: [expect.stringMatching(/^cannot read .*mesh\.yaml: ENOENT/) as unknown],
    });
    expect(sut.policy.edges.length).toBeGreaterThan(0);
  });
});
