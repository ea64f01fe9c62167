import { createPrivateKey, type KeyObject, X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { identityPaths } from './identity-files';
import { pemBlocks, toPem } from './pem';
import { DEFAULT_TRUST_DOMAIN, serviceOfSpiffeId } from './spiffe-id';

/** What an instance's identity files say about it. */
export interface IdentityInfo {
  spiffeId: string;
  service: string;
  notBefore: Date;
  notAfter: Date;
}

export interface ReadIdentityOptions {
  /** Default `infermesh.local`. */
  trustDomain?: string;
  /** Default now. */
  now?: Date;
}

/** A problem with one identity file; `file` is its path. */
export class IdentityFileError extends Error {
  constructor(
    readonly file: string,
    problem: string,
  ) {
    super(`${file}: ${problem}`);
    this.name = 'IdentityFileError';
  }
}

/**
 * Reads and checks an instance's identity files in `dir`: `cert.pem` holds exactly one certificate,
 * valid now, whose key is `key.pem` (PKCS#8), that is signed by a CA of `ca.pem` and carries exactly
 * one URI SAN, a SPIFFE ID of the trust domain. Throws an IdentityFileError naming the file and what
 * is wrong with it.
 */
export async function readIdentity(dir: string, options: ReadIdentityOptions = {}): Promise<IdentityInfo> {
  const trustDomain = options.trustDomain ?? DEFAULT_TRUST_DOMAIN;
  const now = options.now ?? new Date();
  const { certFile, keyFile, caFile } = identityPaths(dir);
  const [certText, keyText, bundleText] = await Promise.all([
    readIdentityFile(certFile),
    readIdentityFile(keyFile),
    readIdentityFile(caFile),
  ]);

  const leaves = parseCertificates(certFile, certText);
  if (leaves.length !== 1) {
    throw new IdentityFileError(
      certFile,
      `holds ${leaves.length} certificates; it must hold the leaf certificate only`,
    );
  }
  const leaf = leaves[0]!;
  const bundle = parseCertificates(caFile, bundleText);
  const key = parseKey(keyFile, keyText);

  if (!leaf.checkPrivateKey(key))
    throw new IdentityFileError(keyFile, `is not the key of the certificate in ${certFile}`);
  if (now.getTime() < leaf.validFromDate.getTime()) {
    throw new IdentityFileError(certFile, `is not valid before ${leaf.validFromDate.toISOString()}`);
  }
  if (now.getTime() > leaf.validToDate.getTime())
    throw new IdentityFileError(certFile, `expired at ${leaf.validToDate.toISOString()}`);
  const issuer = bundle.find((ca) => ca.ca && leaf.checkIssued(ca) && leaf.verify(ca.publicKey));
  if (issuer === undefined) {
    throw new IdentityFileError(certFile, `is not signed by any CA certificate of the trust bundle ${caFile}`);
  }
  if (now.getTime() > issuer.validToDate.getTime()) {
    throw new IdentityFileError(
      caFile,
      `the CA certificate that signed ${certFile} expired at ${issuer.validToDate.toISOString()}`,
    );
  }

  let names: SubjectAltName[];
  try {
    names = subjectAltNames(leaf.subjectAltName);
  } catch (error) {
    throw new IdentityFileError(certFile, (error as Error).message);
  }
  const uris = names.filter((name) => name.type === 'URI');
  if (uris.length === 0) throw new IdentityFileError(certFile, 'has no SPIFFE ID (no URI subject alternative name)');
  if (uris.length > 1) {
    throw new IdentityFileError(
      certFile,
      `has ${uris.length} URI subject alternative names; a SPIFFE certificate has exactly one`,
    );
  }
  const id = uris[0]!.value;
  const service = serviceOfSpiffeId(id, trustDomain);
  if (service === undefined) {
    throw new IdentityFileError(
      certFile,
      `its URI SAN ${JSON.stringify(id)} is not a SPIFFE ID spiffe://${trustDomain}/<service>`,
    );
  }
  return {
    spiffeId: id,
    service,
    notBefore: new Date(leaf.validFromDate.getTime()),
    notAfter: new Date(leaf.validToDate.getTime()),
  };
}

async function readIdentityFile(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new IdentityFileError(file, 'is missing');
    throw new IdentityFileError(file, `cannot be read (${code ?? String(error)})`);
  }
}

function parseCertificates(file: string, text: string): X509Certificate[] {
  const blocks = pemBlocks(text, 'CERTIFICATE');
  if (blocks.length === 0) throw new IdentityFileError(file, 'is not PEM: no BEGIN CERTIFICATE block');
  return blocks.map((body, index) => {
    try {
      return new X509Certificate(toPem('CERTIFICATE', Buffer.from(body, 'base64')));
    } catch (error) {
      throw new IdentityFileError(
        file,
        `certificate ${index + 1} is not a valid X.509 certificate (${(error as Error).message})`,
      );
    }
  });
}

function parseKey(file: string, text: string): KeyObject {
  const blocks = pemBlocks(text, 'PRIVATE KEY');
  if (blocks.length !== 1) throw new IdentityFileError(file, 'is not PEM PKCS#8: expected one BEGIN PRIVATE KEY block');
  try {
    return createPrivateKey({ key: Buffer.from(blocks[0]!, 'base64'), format: 'der', type: 'pkcs8' });
  } catch (error) {
    throw new IdentityFileError(file, `is not a valid PKCS#8 private key (${(error as Error).message})`);
  }
}

/** One entry of node:crypto's `subjectAltName`: `URI:spiffe://…`, `DNS:localhost`, `IP Address:127.0.0.1`. */
export interface SubjectAltName {
  type: string;
  value: string;
}

/**
 * Parses node:crypto's `subjectAltName` text: entries `Type:value` separated by ", ", where a value
 * that holds a comma, quote or other special character is a JSON string.
 */
export function subjectAltNames(text: string | undefined): SubjectAltName[] {
  if (text === undefined || text === '') return [];
  const entry = /([A-Za-z ]+):("(?:[^"\\]|\\.)*"|[^,]*)(?:, |$)/y;
  const names: SubjectAltName[] = [];
  while (entry.lastIndex < text.length) {
    const start = entry.lastIndex;
    const match = entry.exec(text);
    if (match === null) throw new Error(`cannot parse subjectAltName at ${JSON.stringify(text.slice(start))}`);
    const raw = match[2]!;
    names.push({ type: match[1]!, value: raw.startsWith('"') ? (JSON.parse(raw) as string) : raw });
  }
  return names;
}
