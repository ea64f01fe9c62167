/** The trust domain of every identity that `infermesh up`'s local CA issues. */
export const DEFAULT_TRUST_DOMAIN = 'infermesh.local';

/** SPIFFE trust domain names: lowercase letters, digits, dots, dashes and underscores. */
const TRUST_DOMAIN = /^[a-z0-9._-]{1,255}$/;
/** A service is one path segment, usable as a file name and a DNS label alike. */
const SERVICE = /^[a-z0-9-]{1,63}$/;
/** The SPIFFE ID spec's bound on the whole URI. */
const MAX_SPIFFE_ID_LENGTH = 2048;

/**
 * The SPIFFE ID of a service, `spiffe://<trustDomain>/<service>`: what a peer's certificate carries
 * as its only URI SAN and what identifies it in the mesh. Throws on a service or trust domain that
 * cannot be one.
 */
export function spiffeId(service: string, trustDomain = DEFAULT_TRUST_DOMAIN): string {
  checkTrustDomain(trustDomain);
  if (!SERVICE.test(service)) {
    throw new Error(`invalid service name ${JSON.stringify(service)} for a SPIFFE ID: expected 1 to 63 of [a-z0-9-]`);
  }
  return `spiffe://${trustDomain}/${service}`;
}

/** Throws unless `trustDomain` is a SPIFFE trust domain name. */
export function checkTrustDomain(trustDomain: string): void {
  if (!TRUST_DOMAIN.test(trustDomain)) {
    throw new Error(
      `invalid SPIFFE trust domain ${JSON.stringify(trustDomain)}: expected lowercase letters, digits, '.', '-' or '_'`,
    );
  }
}

/**
 * The service that a SPIFFE ID names, or undefined when `id` is not exactly
 * `spiffe://<trustDomain>/<service>`: another scheme or trust domain, a port, user info, a query, a
 * fragment, more or fewer than one path segment, or a character outside [a-z0-9-] are all refused.
 */
export function serviceOfSpiffeId(id: string, trustDomain = DEFAULT_TRUST_DOMAIN): string | undefined {
  if (id.length > MAX_SPIFFE_ID_LENGTH || !TRUST_DOMAIN.test(trustDomain)) return undefined;
  const prefix = `spiffe://${trustDomain}/`;
  if (!id.startsWith(prefix)) return undefined;
  const service = id.slice(prefix.length);
  return SERVICE.test(service) ? service : undefined;
}
