import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { createPrivateKey, createSign, createVerify, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkServerIdentity } from 'node:tls';
import { CA_CERT_FILE, CA_KEY_FILE, LocalCa } from './local-ca';
import { subjectAltNames } from './read-identity';

const DAY_MS = 24 * 3600 * 1000;
const SERVER_AUTH = '1.3.6.1.5.5.7.3.1';
const CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';

describe(LocalCa.name, () => {
  let dir: string;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'local-ca-'));
  });

  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  describe('open', () => {
    it('creates a self-signed P-256 CA with a private key file only its owner reads', async () => {
      const before = Date.now();
      const sut = await LocalCa.open(dir);

      const ca = new X509Certificate(readFileSync(join(dir, CA_CERT_FILE)));
      expect(ca.ca).toBe(true);
      expect(ca.subject).toBe('CN=infermesh local CA');
      expect(ca.checkIssued(ca)).toBe(true);
      expect(ca.verify(ca.publicKey)).toBe(true);
      expect(ca.publicKey.asymmetricKeyDetails?.namedCurve).toBe('prime256v1');
      expect(ca.checkPrivateKey(createPrivateKey(readFileSync(join(dir, CA_KEY_FILE))))).toBe(true);
      expect(ca.validToDate.getTime()).toBeGreaterThan(before + 364 * DAY_MS);
      expect(ca.validToDate.getTime()).toBeLessThanOrEqual(Date.now() + 365 * DAY_MS);
      expect(statSync(join(dir, CA_KEY_FILE)).mode & 0o777).toBe(0o600);
      expect(sut.bundlePem).toBe(readFileSync(join(dir, CA_CERT_FILE), 'utf8'));
      expect(sut.createdBecause).toMatch(/no CA in/);
    });

    it('marks basicConstraints CA critical and limits the key to signing certificates and CRLs', async () => {
      await LocalCa.open(dir);

      const ca = new x509.X509Certificate(readFileSync(join(dir, CA_CERT_FILE), 'utf8'));
      const constraints = ca.getExtension(x509.BasicConstraintsExtension)!;
      expect(constraints.ca).toBe(true);
      expect(constraints.critical).toBe(true);
      const usages = ca.getExtension(x509.KeyUsagesExtension)!;
      expect(usages.usages).toBe(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign);
      expect(usages.critical).toBe(true);
    });

    it('reuses the CA on disk when it opens the folder again', async () => {
      const first = await LocalCa.open(dir);
      const keyBefore = readFileSync(join(dir, CA_KEY_FILE), 'utf8');

      const sut = await LocalCa.open(dir);

      expect(sut.createdBecause).toBeUndefined();
      expect(sut.bundlePem).toBe(first.bundlePem);
      expect(readFileSync(join(dir, CA_KEY_FILE), 'utf8')).toBe(keyBefore);
      // What the reopened CA issues chains to the first one's bundle.
      const leaf = new X509Certificate((await sut.issue({ service: 'worker', instance: 'worker-0' }, 60_000)).certPem);
      expect(leaf.verify(new X509Certificate(first.bundlePem).publicKey)).toBe(true);
    });

    it('replaces a CA that expires within a day', async () => {
      const first = await LocalCa.open(dir);

      const sut = await LocalCa.open(dir, { now: () => new Date(first.notAfter.getTime() - 12 * 3600 * 1000) });

      expect(sut.createdBecause).toMatch(/ca\.pem expires at/);
      expect(sut.bundlePem).not.toBe(first.bundlePem);
      expect(readFileSync(join(dir, CA_CERT_FILE), 'utf8')).toBe(sut.bundlePem);
    });

    it("replaces a CA whose key is not the certificate's", async () => {
      const other = mkdtempSync(join(tmpdir(), 'local-ca-other-'));
      try {
        await LocalCa.open(dir);
        await LocalCa.open(other);
        writeFileSync(join(dir, CA_KEY_FILE), readFileSync(join(other, CA_KEY_FILE)));

        const sut = await LocalCa.open(dir);

        expect(sut.createdBecause).toMatch(/ca\.key\.pem does not match/);
        const ca = new X509Certificate(readFileSync(join(dir, CA_CERT_FILE)));
        expect(ca.checkPrivateKey(createPrivateKey(readFileSync(join(dir, CA_KEY_FILE))))).toBe(true);
      } finally {
        rmSync(other, { recursive: true, force: true });
      }
    });

    it('replaces a CA file that is not PEM', async () => {
      await LocalCa.open(dir);
      writeFileSync(join(dir, CA_CERT_FILE), 'not a certificate');

      const sut = await LocalCa.open(dir);

      expect(sut.createdBecause).toMatch(/ca\.pem holds no certificate/);
    });
  });

  describe('issue', () => {
    it('issues a P-256 leaf with the SPIFFE ID, localhost and loopback SANs for client and server use', async () => {
      const sut = await LocalCa.open(dir);

      const issued = await sut.issue({ service: 'worker', instance: 'worker-1' }, 3_600_000);

      const leaf = new X509Certificate(issued.certPem);
      expect(subjectAltNames(leaf.subjectAltName)).toEqual([
        { type: 'URI', value: 'spiffe://infermesh.local/worker' },
        { type: 'DNS', value: 'localhost' },
        { type: 'IP Address', value: '127.0.0.1' },
        { type: 'IP Address', value: '0:0:0:0:0:0:0:1' },
      ]);
      expect(issued.spiffeId).toBe('spiffe://infermesh.local/worker');
      expect(leaf.ca).toBe(false);
      expect(leaf.keyUsage).toEqual(expect.arrayContaining([SERVER_AUTH, CLIENT_AUTH]));
      expect(leaf.publicKey.asymmetricKeyDetails?.namedCurve).toBe('prime256v1');
      expect(leaf.subject).toBe('OU=worker\nCN=worker-1');
      // The host-name checks a TLS client makes when it dials 127.0.0.1, [::1] or localhost.
      const peer = leaf.toLegacyObject();
      expect(checkServerIdentity('127.0.0.1', peer)).toBeUndefined();
      expect(checkServerIdentity('::1', peer)).toBeUndefined();
      expect(checkServerIdentity('localhost', peer)).toBeUndefined();
      expect(checkServerIdentity('example.com', peer)).toMatchObject({ code: 'ERR_TLS_CERT_ALTNAME_INVALID' });
    });

    it('marks the leaf not a CA and its key for signatures only, both critical', async () => {
      const sut = await LocalCa.open(dir);

      const leaf = new x509.X509Certificate(
        (await sut.issue({ service: 'router', instance: 'router' }, 60_000)).certPem,
      );

      expect(leaf.getExtension(x509.BasicConstraintsExtension)).toMatchObject({ ca: false, critical: true });
      expect(leaf.getExtension(x509.KeyUsagesExtension)).toMatchObject({
        usages: x509.KeyUsageFlags.digitalSignature,
        critical: true,
      });
    });

    it('signs the leaf with the CA', async () => {
      const sut = await LocalCa.open(dir);

      const leaf = new X509Certificate((await sut.issue({ service: 'cache', instance: 'cache-0' }, 60_000)).certPem);

      const ca = new X509Certificate(sut.bundlePem);
      expect(leaf.checkIssued(ca)).toBe(true);
      expect(leaf.verify(ca.publicKey)).toBe(true);
      const otherDir = mkdtempSync(join(tmpdir(), 'local-ca-other-'));
      try {
        const other = await LocalCa.open(otherDir);
        expect(leaf.verify(new X509Certificate(other.bundlePem).publicKey)).toBe(false);
      } finally {
        rmSync(otherDir, { recursive: true, force: true });
      }
    });

    it('dates the leaf from a minute ago for its lifetime', async () => {
      const sut = await LocalCa.open(dir);
      const before = Date.now();

      const issued = await sut.issue({ service: 'gateway', instance: 'gateway' }, 7_200_000);

      const after = Date.now();
      const leaf = new X509Certificate(issued.certPem);
      expect(leaf.validFromDate).toEqual(issued.notBefore);
      expect(leaf.validToDate).toEqual(issued.notAfter);
      expect(leaf.validFromDate.getTime()).toBeGreaterThanOrEqual(before - 61_000);
      expect(leaf.validFromDate.getTime()).toBeLessThanOrEqual(after - 60_000);
      expect(leaf.validToDate.getTime()).toBeGreaterThanOrEqual(before + 7_200_000 - 1000);
      expect(leaf.validToDate.getTime()).toBeLessThanOrEqual(after + 7_200_000);
    });

    it('never dates a leaf past the CA', async () => {
      const sut = await LocalCa.open(dir, { lifetimeMs: 2 * DAY_MS });

      const issued = await sut.issue({ service: 'worker', instance: 'worker-0' }, 30 * DAY_MS);

      expect(issued.notAfter).toEqual(sut.notAfter);
    });

    it("gives a PKCS#8 key that signs what the certificate's public key verifies", async () => {
      const sut = await LocalCa.open(dir);

      const issued = await sut.issue({ service: 'batcher', instance: 'batcher-2' }, 60_000);

      expect(issued.keyPem).toMatch(/^-----BEGIN PRIVATE KEY-----\n/);
      const signature = createSign('sha256').update('payload').sign(createPrivateKey(issued.keyPem));
      const leaf = new X509Certificate(issued.certPem);
      expect(createVerify('sha256').update('payload').verify(leaf.publicKey, signature)).toBe(true);
      expect(createVerify('sha256').update('other').verify(leaf.publicKey, signature)).toBe(false);
    });

    it('gives each leaf a random 16-byte serial number', async () => {
      const sut = await LocalCa.open(dir);

      const serials = await Promise.all(
        [1, 2, 3].map(async () => (await sut.issue({ service: 'worker', instance: 'w' }, 60_000)).serialNumber),
      );

      for (const serial of serials) expect(serial).toMatch(/^[4-7][0-9A-F]{31}$/);
      expect(new Set(serials).size).toBe(3);
    });

    it.each(['..', '.hidden', 'a/b', '', '-x', 'x'.repeat(65)])('refuses the instance name %j', async (instance) => {
      const sut = await LocalCa.open(dir);

      await expect(sut.issue({ service: 'worker', instance }, 60_000)).rejects.toThrow(/invalid instance name/);
    });

    it('refuses a service that cannot be a SPIFFE ID path segment', async () => {
      const sut = await LocalCa.open(dir);

      await expect(sut.issue({ service: 'Worker/1', instance: 'w' }, 60_000)).rejects.toThrow(/invalid service name/);
    });
  });
});
