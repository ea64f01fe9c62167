import { createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { identityPaths, writeIdentityFiles } from './identity-files';
import { type IssuedIdentity, LocalCa } from './local-ca';

describe(writeIdentityFiles.name, () => {
  let root: string;
  let ca: LocalCa;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'identity-files-'));
    ca = await LocalCa.open(join(root, 'ca'));
  });

  afterAll(() => {
    rmSync(root, { recursive: true, force: true });
  });

  it('writes the leaf alone, its PKCS#8 key readable by its owner only, and the bundle', async () => {
    const issued = await ca.issue({ service: 'worker', instance: 'worker-0' }, 60_000);
    const dir = join(root, 'worker-0');

    const paths = await writeIdentityFiles(dir, issued, ca.bundlePem);

    expect(paths).toEqual(identityPaths(dir));
    expect(readdirSync(dir).sort()).toEqual(['ca.pem', 'cert.pem', 'key.pem']);
    expect(readFileSync(paths.certFile, 'utf8')).toBe(issued.certPem);
    expect(readFileSync(paths.certFile, 'utf8').match(/BEGIN CERTIFICATE/g)).toHaveLength(1);
    expect(readFileSync(paths.keyFile, 'utf8')).toMatch(
      /^-----BEGIN PRIVATE KEY-----\n[^]*-----END PRIVATE KEY-----\n$/,
    );
    expect(readFileSync(paths.caFile, 'utf8')).toBe(ca.bundlePem);
    expect(statSync(paths.keyFile).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
  });

  it('replaces a pair with a matching pair, leaving no temporary file', async () => {
    const dir = join(root, 'router');
    await writeIdentityFiles(dir, await ca.issue({ service: 'router', instance: 'router' }, 60_000), ca.bundlePem);
    const next = await ca.issue({ service: 'router', instance: 'router' }, 60_000);

    await writeIdentityFiles(dir, next, ca.bundlePem);

    const { certFile, keyFile } = identityPaths(dir);
    const leaf = new X509Certificate(readFileSync(certFile));
    expect(leaf.serialNumber).toBe(next.serialNumber);
    expect(leaf.checkPrivateKey(createPrivateKey(readFileSync(keyFile)))).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(['ca.pem', 'cert.pem', 'key.pem']);
  });

  it('never shows a reader half a file, and leaves a matching pair after each write', async () => {
    const dir = join(root, 'cache-0');
    const identities: IssuedIdentity[] = [];
    for (let i = 0; i < 20; i++) identities.push(await ca.issue({ service: 'cache', instance: 'cache-0' }, 60_000));
    await writeIdentityFiles(dir, identities[0]!, ca.bundlePem);
    const { certFile, keyFile } = identityPaths(dir);
    const known = new Set(identities.map((identity) => identity.certPem));
    let writing = true;
    let reads = 0;
    const reader = (async () => {
      while (writing) {
        const [cert, key] = await Promise.all([readFile(certFile, 'utf8'), readFile(keyFile, 'utf8')]);
        expect(known.has(cert)).toBe(true);
        createPrivateKey(key); // whole: parses
        reads += 1;
      }
    })();

    for (const identity of identities.slice(1)) {
      await writeIdentityFiles(dir, identity, ca.bundlePem);
      const leaf = new X509Certificate(readFileSync(certFile));
      expect(leaf.serialNumber).toBe(identity.serialNumber);
      expect(leaf.checkPrivateKey(createPrivateKey(readFileSync(keyFile)))).toBe(true);
    }
    writing = false;
    await reader;

    expect(reads).toBeGreaterThan(0);
  });

  it('refuses a certificate PEM with more than the leaf, and keeps the files it had', async () => {
    const dir = join(root, 'gateway');
    const first = await ca.issue({ service: 'gateway', instance: 'gateway' }, 60_000);
    await writeIdentityFiles(dir, first, ca.bundlePem);
    const second = await ca.issue({ service: 'gateway', instance: 'gateway' }, 60_000);

    await expect(
      writeIdentityFiles(dir, { ...second, certPem: second.certPem + ca.bundlePem }, ca.bundlePem),
    ).rejects.toThrow(/exactly one certificate/);

    expect(readFileSync(identityPaths(dir).certFile, 'utf8')).toBe(first.certPem);
    expect(readFileSync(identityPaths(dir).keyFile, 'utf8')).toBe(first.keyPem);
    expect(readdirSync(dir).sort()).toEqual(['ca.pem', 'cert.pem', 'key.pem']);
  });
});
