/**
 * Service identities for mutual TLS: SPIFFE IDs (`spiffe://infermesh.local/<service>`), a local CA
 * for `infermesh up`, and the on-disk contract every instance reads, whoever writes it (this
 * library's IdentityIssuer on one machine; cert-manager's CSI driver or SPIRE on Kubernetes):
 *
 *   <instance folder>/cert.pem   the leaf certificate alone (URI SAN = the SPIFFE ID)
 *   <instance folder>/key.pem    its key, PKCS#8 PEM, mode 0600
 *   <instance folder>/ca.pem     the trust bundle
 */
export * from './spiffe-id';
export * from './local-ca';
export * from './identity-files';
export * from './identity-issuer';
export * from './read-identity';
