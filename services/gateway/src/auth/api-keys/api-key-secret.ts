import { createHash, randomBytes } from 'node:crypto';

/** `im_<id>_<secret>`: the id (12 hex digits) names the key's record; the secret proves it. */
const KEY_FORMAT = /^im_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$/;

export interface ParsedKey {
  id: string;
  secret: string;
}

/** A new key: its id, and the full key the client sends. */
export function generateKey(): { id: string; key: string; secret: string } {
  const id = randomBytes(6).toString('hex');
  const secret = randomBytes(32).toString('base64url');
  return { id, key: `im_${id}_${secret}`, secret };
}

/** The id and secret of a key in the stored-key format, or undefined for any other string. */
export function parseKey(key: string): ParsedKey | undefined {
  const match = KEY_FORMAT.exec(key);
  return match === null ? undefined : { id: match[1]!, secret: match[2]! };
}

/**
 * What is stored instead of the secret. The secret is 256 random bits, so one salted SHA-256 is as
 * strong as a slow password hash would be, and cheap enough for every request.
 */
export function hashSecret(salt: Uint8Array, secret: string): Uint8Array {
  return createHash('sha256').update(salt).update(secret, 'utf8').digest();
}

export function newSalt(): Uint8Array {
  return randomBytes(16);
}
