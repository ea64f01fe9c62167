import * as grpc from '@grpc/grpc-js';
import type { PeerCertificate } from 'node:tls';

/**
 * The process's identity for mutual TLS: the files of one instance (on one machine written by
 * `infermesh up`'s local CA, on Kubernetes mounted by cert-manager's CSI driver or SPIRE), reread
 * every `refreshMs` so that rotated certificates are taken without a restart.
 */
export interface TransportSecurity {
  /** The instance's certificate (its SPIFFE ID as a URI SAN). */
  certFile: string;
  keyFile: string;
  /** The trust bundle: peers must chain to it. */
  caFile: string;
  /** SPIFFE trust domain of every peer (`infermesh.local`). */
  trustDomain: string;
  refreshMs: number;
}

interface Configured {
  settings: TransportSecurity;
  provider: grpc.experimental.FileWatcherCertificateProvider;
  server: grpc.ServerCredentials;
}

let configured: Configured | undefined;
/** Identities other than the process's own that clients were given (a supervisor's), by certificate file. */
const others = new Map<string, Configured>();

function configuredFor(settings: TransportSecurity): Configured {
  const provider = new grpc.experimental.FileWatcherCertificateProvider({
    certificateFile: settings.certFile,
    privateKeyFile: settings.keyFile,
    caCertificateFile: settings.caFile,
    refreshIntervalMs: settings.refreshMs,
  });
  return {
    settings,
    provider,
    server: grpc.experimental.createCertificateProviderServerCredentials(provider, provider, true),
  };
}

/** What a client uses: the given identity, plaintext (null), or the process's (undefined). */
function select(transport: TransportSecurity | null | undefined): Configured | undefined {
  if (transport === null) return undefined;
  if (transport === undefined) return configured;
  let found = others.get(transport.certFile);
  if (
    found === undefined ||
    found.settings.keyFile !== transport.keyFile ||
    found.settings.caFile !== transport.caFile
  ) {
    found = configuredFor(transport);
    others.set(transport.certFile, found);
  }
  return found;
}

/**
 * Sets the process's transport security, once at start-up, before any client or server is made:
 * undefined keeps plaintext. Every server then requires a client certificate from the trust bundle,
 * and every client presents the instance's and checks the server's SPIFFE ID.
 */
export function configureTransportSecurity(settings: TransportSecurity | undefined): void {
  if (settings === undefined) {
    configured = undefined;
    return;
  }
  configured = configuredFor(settings);
}

/** Whether the process speaks mutual TLS. */
export function transportSecurity(): TransportSecurity | undefined {
  return configured?.settings;
}

/** The credentials a server binds with: mutual TLS when configured, else plaintext. */
export function serverCredentials(): grpc.ServerCredentials {
  return configured?.server ?? grpc.ServerCredentials.createInsecure();
}

const SPIFFE_SAN = /(?:^|,\s*)URI:(spiffe:\/\/[^,\s]+)/;

/** The SPIFFE ID of a peer certificate (its URI SAN), if it has one. */
export function spiffeIdOf(certificate: Pick<PeerCertificate, 'subjectaltname'> | undefined): string | undefined {
  const san = certificate?.subjectaltname;
  if (typeof san !== 'string') return undefined;
  return SPIFFE_SAN.exec(san)?.[1];
}

/** The mesh service a target names: `xds:///router` is the router; a plain address names none. */
function serviceOfTarget(target: string): string | undefined {
  const match = /^xds:\/\/\/([a-z0-9-]+)$/.exec(target);
  return match?.[1];
}

/**
 * The credentials a client dials `target` with: when configured, mutual TLS presenting this
 * instance's certificate and accepting a server only when its certificate chains to the trust bundle
 * and carries a SPIFFE ID of the trust domain — of the service the target names, for `xds:///<service>`
 * and when `peer` is given. The host name is not what identifies a peer in the mesh: its SPIFFE ID is.
 */
export function channelCredentials(
  target: string,
  peer?: string,
  transport?: TransportSecurity | null,
): grpc.ChannelCredentials {
  const chosen = select(transport);
  if (chosen === undefined) return grpc.credentials.createInsecure();
  const { trustDomain } = chosen.settings;
  const expected = peer ?? serviceOfTarget(target);
  const prefix = `spiffe://${trustDomain}/`;
  return grpc.experimental.createCertificateProviderChannelCredentials(chosen.provider, chosen.provider, {
    checkServerIdentity: (_host, certificate) => {
      const id = spiffeIdOf(certificate);
      if (id === undefined || !id.startsWith(prefix)) {
        return new Error(`the server's certificate has no SPIFFE ID of ${trustDomain} (${id ?? 'none'})`);
      }
      if (expected !== undefined && id !== `${prefix}${expected}`)
        return new Error(`the server is ${id}, not ${prefix}${expected}`);
      return undefined;
    },
  });
}

/**
 * The channel options that go with channelCredentials: the TLS server name is the peer's mesh name
 * (`router.infermesh.local`), not an IP address (which RFC 6066 forbids as a server name); peers are
 * identified by their SPIFFE ID, never by this name.
 */
export function secureChannelOptions(
  target: string,
  peer?: string,
  transport?: TransportSecurity | null,
): grpc.ChannelOptions {
  const chosen = select(transport);
  if (chosen === undefined) return {};
  return {
    'grpc.ssl_target_name_override': `${peer ?? serviceOfTarget(target) ?? 'mesh'}.${chosen.settings.trustDomain}`,
  };
}
