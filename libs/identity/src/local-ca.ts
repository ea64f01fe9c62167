// @peculiar/x509 resolves its ASN.1 codecs through tsyringe, which needs the Reflect metadata API.
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { createPrivateKey, type KeyObject, randomBytes, webcrypto, X509Certificate } from 'node:crypto';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { replaceFiles } from './atomic-files';
import { certificatesPem, toPem } from './pem';
import { checkTrustDomain, DEFAULT_TRUST_DOMAIN, spiffeId } from './spiffe-id';

/** Which instance of which service an identity is for: `{ service: 'worker', instance: 'worker-1' }`. */
export interface ServiceIdentity {
  /** The SPIFFE ID's path segment: [a-z0-9-]. */
  service: string;
  /** The instance's name, which is also the name of its folder: [A-Za-z0-9._-], at most 64, not starting with '.' or '-'. */
  instance: string;
}

/** A leaf certificate and its key, both PEM: what an instance's `cert.pem` and `key.pem` hold. */
export interface IssuedIdentity {
  certPem: string;
  /** PKCS#8. */
  keyPem: string;
  spiffeId: string;
  /** Uppercase hex, as node:crypto's X509Certificate prints it. */
  serialNumber: string;
  notBefore: Date;
  notAfter: Date;
}

/** What issues identities: the local CA here; on Kubernetes cert-manager or SPIRE play this part. */
export interface CertificateAuthority {
  /** The trust bundle (PEM): what every instance's `ca.pem` holds. */
  readonly bundlePem: string;
  issue(identity: ServiceIdentity, lifetimeMs: number): Promise<IssuedIdentity>;
}

export interface LocalCaOptions {
  /** Lifetime of a CA that `open` creates. Default 365 days. */
  lifetimeMs?: number;
  /** A CA on disk with less validity left than this is replaced by a new one. Default one day. */
  minRemainingMs?: number;
  /** Default `infermesh.local`. */
  trustDomain?: string;
  /** The clock certificates are dated by. Default the system clock. */
  now?: () => Date;
}

const DAY_MS = 24 * 3600 * 1000;
/** A leaf is valid from this long before it was issued, so that a peer whose clock is behind accepts it. */
export const CLOCK_SKEW_MS = 60_000;
export const CA_SUBJECT = 'infermesh local CA';
export const CA_CERT_FILE = 'ca.pem';
export const CA_KEY_FILE = 'ca.key.pem';

const KEY_ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256' } as const;
const SIGNING_ALGORITHM = { name: 'ECDSA', hash: 'SHA-256' } as const;
/** node:crypto's name of P-256. */
const P256 = 'prime256v1';
const INSTANCE = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$/;
const crypto = webcrypto;

/**
 * The certificate authority of one machine: it issues the services' identities for mutual TLS when
 * `infermesh up` runs them side by side. Its key and certificate stay in one folder (`ca.key.pem`,
 * mode 0600, and `ca.pem`) and are reused by every later `open` while valid.
 *
 * One process should own the folder: two that `open` a folder without a valid CA at the same moment
 * each create one, and the files end up holding either's.
 */
export class LocalCa implements CertificateAuthority {
  private constructor(
    /** The folder of `ca.pem` and `ca.key.pem`. */
    readonly dir: string,
    readonly bundlePem: string,
    readonly notAfter: Date,
    /** Why `open` made a new CA (none on disk, expiring, unreadable), or undefined when it reused the one on disk. */
    readonly createdBecause: string | undefined,
    private readonly certificate: x509.X509Certificate,
    private readonly signingKey: webcrypto.CryptoKey,
    private readonly trustDomain: string,
    private readonly now: () => Date,
  ) {}

  /**
   * The CA of `dir`: the one on disk when both files are there, match, are a P-256 CA and are valid
   * for at least `minRemainingMs` more; else a new one, written to the folder (key first, each file
   * replaced atomically). Every identity issued by a CA it replaces must be issued again.
   */
  static async open(dir: string, options: LocalCaOptions = {}): Promise<LocalCa> {
    const lifetimeMs = options.lifetimeMs ?? 365 * DAY_MS;
    const minRemainingMs = options.minRemainingMs ?? DAY_MS;
    const trustDomain = options.trustDomain ?? DEFAULT_TRUST_DOMAIN;
    const now = options.now ?? (() => new Date());
    checkTrustDomain(trustDomain);
    if (!(lifetimeMs > minRemainingMs)) {
      throw new Error(
        `the local CA's lifetime (${lifetimeMs} ms) must exceed the validity it must have left (${minRemainingMs} ms)`,
      );
    }
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const loaded = await loadCa(dir, now(), minRemainingMs);
    if (typeof loaded === 'string') {
      const created = await createCa(now(), lifetimeMs);
      await replaceFiles(dir, [
        { name: CA_KEY_FILE, content: created.keyPem, mode: 0o600 },
        { name: CA_CERT_FILE, content: created.certPem, mode: 0o644 },
      ]);
      return new LocalCa(
        dir,
        created.certPem,
        created.certificate.notAfter,
        loaded,
        created.certificate,
        created.signingKey,
        trustDomain,
        now,
      );
    }
    return new LocalCa(
      dir,
      loaded.certPem,
      loaded.certificate.notAfter,
      undefined,
      loaded.certificate,
      loaded.signingKey,
      trustDomain,
      now,
    );
  }

  /**
   * A new key and a leaf certificate for `identity`: ECDSA P-256, URI SAN = its SPIFFE ID, DNS SAN
   * `localhost` and IP SANs 127.0.0.1 and ::1 (for peers that check the host name they dialled),
   * serverAuth and clientAuth, valid from a minute ago (clock skew) for `lifetimeMs`, but never past
   * the CA's own expiry.
   */
  async issue(identity: ServiceIdentity, lifetimeMs: number): Promise<IssuedIdentity> {
    checkInstanceName(identity.instance);
    const id = spiffeId(identity.service, this.trustDomain);
    if (!(lifetimeMs >= 1000)) throw new Error(`a certificate's lifetime must be at least 1000 ms, not ${lifetimeMs}`);
    const nowMs = this.now().getTime();
    const notBefore = wholeSeconds(nowMs - CLOCK_SKEW_MS);
    const notAfter = new Date(Math.min(wholeSeconds(nowMs + lifetimeMs).getTime(), this.notAfter.getTime()));
    if (notAfter.getTime() <= nowMs) {
      throw new Error(
        `the local CA in ${this.dir} expired at ${this.notAfter.toISOString()}; open it again to make a new one`,
      );
    }
    const keys = await crypto.subtle.generateKey(KEY_ALGORITHM, true, ['sign', 'verify']);
    const certificate = await x509.X509CertificateGenerator.create(
      {
        serialNumber: randomSerialNumber(),
        subject: [{ OU: [identity.service] }, { CN: [identity.instance] }],
        issuer: this.certificate.subjectName,
        notBefore,
        notAfter,
        signingAlgorithm: SIGNING_ALGORITHM,
        publicKey: keys.publicKey,
        signingKey: this.signingKey,
        extensions: [
          new x509.BasicConstraintsExtension(false, undefined, true),
          new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
          new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
          new x509.SubjectAlternativeNameExtension([
            { type: 'url', value: id },
            { type: 'dns', value: 'localhost' },
            { type: 'ip', value: '127.0.0.1' },
            { type: 'ip', value: '::1' },
          ]),
          await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, crypto),
          await x509.AuthorityKeyIdentifierExtension.create(this.certificate.publicKey, false, crypto),
        ],
      },
      crypto,
    );
    return {
      certPem: toPem('CERTIFICATE', certificate.rawData),
      keyPem: toPem('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
      spiffeId: id,
      serialNumber: new X509Certificate(Buffer.from(certificate.rawData)).serialNumber,
      notBefore: certificate.notBefore,
      notAfter: certificate.notAfter,
    };
  }
}

interface LoadedCa {
  certPem: string;
  certificate: x509.X509Certificate;
  signingKey: webcrypto.CryptoKey;
}

/** The CA on disk, or why there is none usable. */
async function loadCa(dir: string, now: Date, minRemainingMs: number): Promise<LoadedCa | string> {
  const certFile = join(dir, CA_CERT_FILE);
  const keyFile = join(dir, CA_KEY_FILE);
  const [certText, keyText] = await Promise.all([readOptional(certFile), readOptional(keyFile)]);
  if (certText === undefined && keyText === undefined) return `no CA in ${dir}`;
  if (certText === undefined) return `${certFile} is missing`;
  if (keyText === undefined) return `${keyFile} is missing`;
  const certPem = certificatesPem(certText);
  let certificate: X509Certificate;
  let key: KeyObject;
  try {
    certificate = new X509Certificate(certPem);
  } catch {
    return `${certFile} holds no certificate`;
  }
  try {
    key = createPrivateKey(keyText);
  } catch {
    return `${keyFile} holds no private key`;
  }
  if (!certificate.ca) return `${certFile} is not a CA certificate`;
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== P256)
    return `${keyFile} is not an ECDSA P-256 key`;
  if (!certificate.checkPrivateKey(key)) return `${keyFile} does not match ${certFile}`;
  if (certificate.validFromDate.getTime() > now.getTime())
    return `${certFile} is not valid before ${certificate.validFromDate.toISOString()}`;
  if (certificate.validToDate.getTime() - now.getTime() < minRemainingMs)
    return `${certFile} expires at ${certificate.validToDate.toISOString()}`;
  const pkcs8 = key.export({ type: 'pkcs8', format: 'der' });
  return {
    certPem,
    certificate: new x509.X509Certificate(certificate.raw),
    signingKey: await crypto.subtle.importKey('pkcs8', pkcs8, KEY_ALGORITHM, false, ['sign']),
  };
}

async function createCa(now: Date, lifetimeMs: number): Promise<LoadedCa & { keyPem: string }> {
  const keys = await crypto.subtle.generateKey(KEY_ALGORITHM, true, ['sign', 'verify']);
  const certificate = await x509.X509CertificateGenerator.createSelfSigned(
    {
      serialNumber: randomSerialNumber(),
      name: [{ CN: [CA_SUBJECT] }],
      notBefore: wholeSeconds(now.getTime() - CLOCK_SKEW_MS),
      notAfter: wholeSeconds(now.getTime() + lifetimeMs),
      signingAlgorithm: SIGNING_ALGORITHM,
      keys,
      extensions: [
        // Path length 0: it signs leaves, never another CA.
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, crypto),
      ],
    },
    crypto,
  );
  return {
    certPem: toPem('CERTIFICATE', certificate.rawData),
    keyPem: toPem('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
    certificate,
    signingKey: keys.privateKey,
  };
}

/** Throws unless `instance` can name an instance (and its folder): never '.', '..' or a path. */
export function checkInstanceName(instance: string): void {
  if (!INSTANCE.test(instance)) {
    throw new Error(
      `invalid instance name ${JSON.stringify(instance)}: expected 1 to 64 of [A-Za-z0-9._-], not starting with '.' or '-'`,
    );
  }
}

async function readOptional(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
}

/** 16 random bytes, positive and without a leading zero byte, so that its DER encoding is 16 bytes too. */
function randomSerialNumber(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0]! & 0x3f) | 0x40;
  return bytes.toString('hex');
}

/** X.509 dates hold whole seconds: the date as it will read back from the certificate. */
function wholeSeconds(ms: number): Date {
  return new Date(Math.floor(ms / 1000) * 1000);
}
