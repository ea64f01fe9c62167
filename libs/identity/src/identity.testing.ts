import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { createPrivateKey, webcrypto } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CA_CERT_FILE, CA_KEY_FILE } from './local-ca';
import { toPem } from './pem';

/**
 * A leaf that the local CA would never issue (other SANs, other dates), signed with the key in
 * `caDir`: for the specs of what readers refuse.
 */
export async function craftLeaf(
  caDir: string,
  options: { names: x509.JsonGeneralNames; notBefore?: Date; notAfter?: Date },
): Promise<{ certPem: string; keyPem: string }> {
  const crypto = webcrypto;
  const caCert = new x509.X509Certificate(readFileSync(join(caDir, CA_CERT_FILE), 'utf8'));
  const caKeyDer = createPrivateKey(readFileSync(join(caDir, CA_KEY_FILE), 'utf8')).export({
    type: 'pkcs8',
    format: 'der',
  });
  const algorithm = { name: 'ECDSA', namedCurve: 'P-256' };
  const signingKey = await crypto.subtle.importKey('pkcs8', caKeyDer, algorithm, false, ['sign']);
  const keys = await crypto.subtle.generateKey(algorithm, true, ['sign', 'verify']);
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create(
    {
      serialNumber: '01',
      subject: 'CN=crafted',
      issuer: caCert.subjectName,
      notBefore: options.notBefore ?? new Date(now - 60_000),
      notAfter: options.notAfter ?? new Date(now + 3_600_000),
      signingAlgorithm: { name: 'ECDSA', hash: 'SHA-256' },
      publicKey: keys.publicKey,
      signingKey,
      extensions: [new x509.SubjectAlternativeNameExtension(options.names)],
    },
    crypto,
  );
  return {
    certPem: toPem('CERTIFICATE', cert.rawData),
    keyPem: toPem('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
  };
}
