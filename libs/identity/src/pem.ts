/** The base64 bodies of a PEM text's blocks with this label (`CERTIFICATE`, `PRIVATE KEY`), in order. */
export function pemBlocks(text: string, label: string): string[] {
  const pattern = new RegExp(`-----BEGIN ${label}-----([A-Za-z0-9+/=\\s]*?)-----END ${label}-----`, 'g');
  return [...text.matchAll(pattern)].map((match) => match[1]!.replace(/\s+/g, ''));
}

/** One PEM block: base64 in 64-character lines, ending with a newline. */
export function toPem(label: string, der: Uint8Array | ArrayBuffer): string {
  const base64 = Buffer.from(der instanceof ArrayBuffer ? new Uint8Array(der) : der).toString('base64');
  const lines = base64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join('\n')}\n-----END ${label}-----\n`;
}

/** Re-encodes every certificate of a PEM text, dropping anything else (comments, other blocks). */
export function certificatesPem(text: string): string {
  return pemBlocks(text, 'CERTIFICATE')
    .map((body) => toPem('CERTIFICATE', Buffer.from(body, 'base64')))
    .join('');
}
