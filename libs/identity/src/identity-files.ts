import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { replaceFiles } from './atomic-files';
import type { IssuedIdentity } from './local-ca';
import { certificatesPem, pemBlocks } from './pem';

/**
 * The on-disk contract of one instance's identity, the same whoever writes it (the local CA here,
 * cert-manager's CSI driver or SPIRE on Kubernetes): the leaf certificate alone, its PKCS#8 key
 * (mode 0600) and the trust bundle.
 */
export const IDENTITY_FILES = { cert: 'cert.pem', key: 'key.pem', bundle: 'ca.pem' } as const;

export interface IdentityPaths {
  dir: string;
  certFile: string;
  keyFile: string;
  caFile: string;
}

/** The paths of the identity files in `dir`. */
export function identityPaths(dir: string): IdentityPaths {
  return {
    dir,
    certFile: join(dir, IDENTITY_FILES.cert),
    keyFile: join(dir, IDENTITY_FILES.key),
    caFile: join(dir, IDENTITY_FILES.bundle),
  };
}

/**
 * Writes an instance's identity files, creating the folder (mode 0700) when missing. Each file is
 * first written whole to a temporary file in the folder; then `ca.pem`, `cert.pem` and `key.pem`
 * are renamed over the old ones back to back, so a reader never sees a file half written.
 *
 * The remaining window: the two renames of the pair are microseconds apart but not one step, so a
 * reader that opens `cert.pem` and `key.pem` while they run can get a new certificate with the old
 * key or the reverse, and keeps that pair until its next reread (grpc-js's
 * FileWatcherCertificateProvider: one refresh interval, during which its handshakes fail). The
 * certificate is renamed first because readers open it first (grpc-js starts both reads in one
 * tick, cert first; most others read cert, then key): for such a reader the pair then mismatches
 * only when its two opens straddle both renames or both fall between them, instead of whenever they
 * overlap the renames at all. Both pairs are valid at that moment (rotation is at half-life), so
 * the reader's next reread heals it.
 */
export async function writeIdentityFiles(
  dir: string,
  issued: Pick<IssuedIdentity, 'certPem' | 'keyPem'>,
  bundlePem: string,
): Promise<IdentityPaths> {
  const certPem = certificatesPem(issued.certPem);
  if (pemBlocks(certPem, 'CERTIFICATE').length !== 1)
    throw new Error('the issued certificate PEM must hold exactly one certificate (the leaf)');
  if (pemBlocks(issued.keyPem, 'PRIVATE KEY').length !== 1)
    throw new Error('the issued key must be one PKCS#8 PEM block (BEGIN PRIVATE KEY)');
  const bundle = certificatesPem(bundlePem);
  if (bundle === '') throw new Error('the trust bundle holds no certificate');
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await replaceFiles(dir, [
    { name: IDENTITY_FILES.bundle, content: bundle, mode: 0o644 },
    { name: IDENTITY_FILES.cert, content: certPem, mode: 0o644 },
    { name: IDENTITY_FILES.key, content: issued.keyPem, mode: 0o600 },
  ]);
  return identityPaths(dir);
}
