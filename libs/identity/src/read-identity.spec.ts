import { mkdtempSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { craftLeaf } from './identity.testing';
import { identityPaths, writeIdentityFiles } from './identity-files';
import { LocalCa } from './local-ca';
import { IdentityFileError, readIdentity, subjectAltNames } from './read-identity';

describe(readIdentity.name, () => {
  let root: string;
  let ca: LocalCa;
  let dir: string;
  let index = 0;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'read-identity-'));
    ca = await LocalCa.open(join(root, 'ca'));
  });

  afterAll(() => {
    rmSync(root, { recursive: true, force: true });
  });

  beforeEach(async () => {
    dir = join(root, `instance-${index++}`);
    await writeIdentityFiles(dir, await ca.issue({ service: 'worker', instance: 'worker-0' }, 3_600_000), ca.bundlePem);
  });

  it("gives the leaf's SPIFFE ID, service and validity", async () => {
    const info = await readIdentity(dir);

    expect(info).toEqual({
      spiffeId: 'spiffe://infermesh.local/worker',
      service: 'worker',
      notBefore: expect.any(Date),
      notAfter: expect.any(Date),
    });
    expect(info.notAfter.getTime() - Date.now()).toBeGreaterThan(3_500_000);
  });

  it.each(['cert.pem', 'key.pem', 'ca.pem'])('names %s when it is missing', async (file) => {
    unlinkSync(join(dir, file));

    await expect(readIdentity(dir)).rejects.toThrow(`${join(dir, file)}: is missing`);
  });

  it('names a file that is not PEM', async () => {
    writeFileSync(identityPaths(dir).certFile, 'hello');

    await expect(readIdentity(dir)).rejects.toThrow(
      `${identityPaths(dir).certFile}: is not PEM: no BEGIN CERTIFICATE block`,
    );
  });

  it('names a key that is not PKCS#8 PEM', async () => {
    writeFileSync(identityPaths(dir).keyFile, 'hello');

    await expect(readIdentity(dir)).rejects.toThrow(`${identityPaths(dir).keyFile}: is not PEM PKCS#8`);
  });

  it('refuses a certificate file with more than the leaf', async () => {
    writeFileSync(
      identityPaths(dir).certFile,
      (await ca.issue({ service: 'worker', instance: 'worker-0' }, 60_000)).certPem + ca.bundlePem,
    );

    await expect(readIdentity(dir)).rejects.toThrow(
      `${identityPaths(dir).certFile}: holds 2 certificates; it must hold the leaf certificate only`,
    );
  });

  it('refuses an expired certificate', async () => {
    const { notAfter } = await readIdentity(dir);

    const failure = readIdentity(dir, { now: new Date(notAfter.getTime() + 1000) });

    await expect(failure).rejects.toThrow(`${identityPaths(dir).certFile}: expired at ${notAfter.toISOString()}`);
    await expect(failure).rejects.toBeInstanceOf(IdentityFileError);
  });

  it('refuses a certificate that the bundle did not sign', async () => {
    const other = await LocalCa.open(join(root, `other-ca-${index}`));
    writeFileSync(identityPaths(dir).caFile, other.bundlePem);

    await expect(readIdentity(dir)).rejects.toThrow(
      `${identityPaths(dir).certFile}: is not signed by any CA certificate of the trust bundle ${identityPaths(dir).caFile}`,
    );
  });

  it('accepts a bundle that holds the signing CA among others', async () => {
    const other = await LocalCa.open(join(root, `other-ca-${index}`));
    writeFileSync(identityPaths(dir).caFile, other.bundlePem + ca.bundlePem);

    await expect(readIdentity(dir)).resolves.toMatchObject({ service: 'worker' });
  });

  it("refuses a key that is not the certificate's", async () => {
    writeFileSync(
      identityPaths(dir).keyFile,
      (await ca.issue({ service: 'worker', instance: 'worker-0' }, 60_000)).keyPem,
    );

    await expect(readIdentity(dir)).rejects.toThrow(
      `${identityPaths(dir).keyFile}: is not the key of the certificate in ${identityPaths(dir).certFile}`,
    );
  });

  it('refuses a certificate without a SPIFFE ID', async () => {
    const leaf = await craftLeaf(join(root, 'ca'), { names: [{ type: 'dns', value: 'localhost' }] });
    writeFileSync(identityPaths(dir).certFile, leaf.certPem);
    writeFileSync(identityPaths(dir).keyFile, leaf.keyPem);

    await expect(readIdentity(dir)).rejects.toThrow(
      `${identityPaths(dir).certFile}: has no SPIFFE ID (no URI subject alternative name)`,
    );
  });

  it('refuses a certificate with two URI SANs', async () => {
    const leaf = await craftLeaf(join(root, 'ca'), {
      names: [
        { type: 'url', value: 'spiffe://infermesh.local/worker' },
        { type: 'url', value: 'spiffe://infermesh.local/router' },
      ],
    });
    writeFileSync(identityPaths(dir).certFile, leaf.certPem);
    writeFileSync(identityPaths(dir).keyFile, leaf.keyPem);

    await expect(readIdentity(dir)).rejects.toThrow(
      /has 2 URI subject alternative names; a SPIFFE certificate has exactly one/,
    );
  });

  it('refuses a SPIFFE ID of another trust domain', async () => {
    await expect(readIdentity(dir, { trustDomain: 'prod.example' })).rejects.toThrow(
      `${identityPaths(dir).certFile}: its URI SAN "spiffe://infermesh.local/worker" is not a SPIFFE ID spiffe://prod.example/<service>`,
    );
  });
});

describe(subjectAltNames.name, () => {
  it('reads plain and JSON-quoted entries', () => {
    expect(subjectAltNames('DNS:localhost, URI:"spiffe://x/a, b", IP Address:127.0.0.1')).toEqual([
      { type: 'DNS', value: 'localhost' },
      { type: 'URI', value: 'spiffe://x/a, b' },
      { type: 'IP Address', value: '127.0.0.1' },
    ]);
    expect(subjectAltNames(undefined)).toEqual([]);
  });
});
