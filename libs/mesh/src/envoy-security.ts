import { ANYONE, HEALTH_METHODS, type MeshPolicy, type MeshService, type OPERATOR, spiffeId } from './mesh-policy';

/**
 * Mutual TLS and authorization in Envoy's terms, compiled from the policy's `mtls`, `identity` and
 * `authorization` (field names are the protos' own, as in envoy-bootstrap.ts).
 *
 * Certificates come by file-based SDS: each TLS context names two secrets, each in a file of its own
 * next to the bootstrap (`<sidecar.configDir>/sds-identity.yaml`, `sds-trust-bundle.yaml`: one
 * DiscoveryResponse holding one Secret, as Envoy's filesystem SDS subscription reads them). The
 * secrets refer to the files in `identity.certificateDir` (cert.pem, key.pem, ca.pem) and watch
 * that folder, so when cert-manager's CSI driver swaps them in (an atomic rename in the folder),
 * Envoy reloads the pair and the trust bundle without a restart — the rotation Envoy documents for
 * file-based certificates; certificates written into a static TLS context would be read once. The
 * SDS files themselves are watched through their folder (a ConfigMap swaps its files by a rename
 * there too). Envoy needs them, and the certificate files, to exist when it starts.
 */

type Json = Record<string, unknown>;

const any = (type: string, value: Json): Json => ({ '@type': `type.googleapis.com/${type}`, ...value });

/** The SDS secret of the instance's certificate and key. */
export const IDENTITY_SECRET = 'infermesh_identity';
/** The SDS secret of the trust bundle (the CA certificates peers must chain to). */
export const TRUST_BUNDLE_SECRET = 'infermesh_trust_bundle';
/** The file of each SDS secret, in `sidecar.configDir`. */
export const SDS_FILES = {
  [IDENTITY_SECRET]: 'sds-identity.yaml',
  [TRUST_BUNDLE_SECRET]: 'sds-trust-bundle.yaml',
} as const;

const TLS_TRANSPORT_SOCKET = 'envoy.transport_sockets.tls';
/** The message of the RBAC HTTP filter's typed config. */
export const RBAC_FILTER_TYPE = 'envoy.extensions.filters.http.rbac.v3.RBAC';
/** The RBAC policy of health checks, which anyone may call. */
export const HEALTH_POLICY = 'health';

/** How an SDS secret is found: the file in the sidecar's config folder, reread when the folder's ConfigMap changes. */
function sdsSecret(policy: MeshPolicy, name: keyof typeof SDS_FILES): Json {
  const dir = policy.sidecar.configDir;
  return {
    name,
    sds_config: {
      path_config_source: { path: `${dir.replace(/\/$/, '')}/${SDS_FILES[name]}`, watched_directory: { path: dir } },
      resource_api_version: 'V3',
    },
  };
}

/** TLS 1.2 at least, 1.3 when both ends have it (Envoy's clients stop at 1.2 unless told). */
const TLS_PARAMS: Json = { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_3' };

/** The certificate presented and the trust bundle peers are checked against, both by SDS; peers' URI SANs matched as given. */
function commonTlsContext(policy: MeshPolicy, alpn: string[], peerSan: Json): Json {
  return {
    tls_params: TLS_PARAMS,
    alpn_protocols: alpn,
    tls_certificate_sds_secret_configs: [sdsSecret(policy, IDENTITY_SECRET)],
    combined_validation_context: {
      default_validation_context: { match_typed_subject_alt_names: [{ san_type: 'URI', matcher: peerSan }] },
      validation_context_sds_secret_config: sdsSecret(policy, TRUST_BUNDLE_SECRET),
    },
  };
}

/**
 * The transport socket of a cluster to `service`'s instances (their sidecars' inbound listeners):
 * TLS presenting this instance's certificate, accepting the peer only when it chains to the trust
 * bundle and its URI SAN is the service's SPIFFE ID. Undefined without mTLS.
 */
export function upstreamTransportSocket(policy: MeshPolicy, service: MeshService): Json | undefined {
  if (!policy.mtls) return undefined;
  return {
    name: TLS_TRANSPORT_SOCKET,
    typed_config: any('envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext', {
      common_tls_context: commonTlsContext(policy, ['h2'], { exact: spiffeId(policy, service) }),
    }),
  };
}

/** Whether a service takes calls from callers without a mesh identity (a rule `from: anyone`). */
export function admitsAnyone(policy: MeshPolicy, service: MeshService): boolean {
  return policy.authorization[service].some((rule) => rule.from.includes(ANYONE));
}

/**
 * The transport socket of a service's inbound listener: TLS with the instance's certificate,
 * requiring a client certificate that chains to the trust bundle with a SPIFFE ID of the trust
 * domain — unless the service admits anyone (the gateway's public API): then a certificate is still
 * checked when one is presented, and the RBAC filter tells the callers apart. Undefined without mTLS.
 */
export function downstreamTransportSocket(policy: MeshPolicy, service: MeshService): Json | undefined {
  if (!policy.mtls) return undefined;
  return {
    name: TLS_TRANSPORT_SOCKET,
    typed_config: any('envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext', {
      common_tls_context: commonTlsContext(policy, ['h2', 'http/1.1'], {
        prefix: `spiffe://${policy.identity.trustDomain}/`,
      }),
      require_client_certificate: !admitsAnyone(policy, service),
    }),
  };
}

/** A method pattern as an RBAC permission on the request's path: `/pkg.Service/*` a prefix, else the exact path. */
function methodPermission(pattern: string): Json {
  return { url_path: { path: pattern.endsWith('/*') ? { prefix: pattern.slice(0, -1) } : { exact: pattern } } };
}

/**
 * The policies of a service's RBAC filter: one per rule of its `authorization`, named after it
 * (`authorization.router[0]`, so a refusal or a stat leads back to the policy file; principals: the
 * SPIFFE IDs of its callers, or any for `anyone`; permissions: its methods), and `health` (anyone
 * may check health). A call is allowed when one policy has both a principal and a permission that
 * match it.
 */
export function rbacPolicies(policy: MeshPolicy, service: MeshService): Record<string, Json> {
  const policies: Record<string, Json> = {};
  policy.authorization[service].forEach((rule, i) => {
    policies[`authorization.${service}[${i}]`] = {
      permissions: rule.methods.map(methodPermission),
      principals: rule.from.includes(ANYONE)
        ? [{ any: true }]
        : rule.from.map((caller) => ({
            authenticated: { principal_name: { exact: spiffeId(policy, caller as MeshService | typeof OPERATOR) } },
          })),
    };
  });
  policies[HEALTH_POLICY] = { permissions: [methodPermission(HEALTH_METHODS)], principals: [{ any: true }] };
  return policies;
}

/**
 * The RBAC HTTP filter of a service's inbound listener (before the fault filter: a refused call is
 * not delayed or failed on purpose first); none without mTLS, where no caller has an identity.
 * The action is ALLOW, proto3's default, left out so the filter reads back exactly as compiled.
 */
export function rbacFilter(policy: MeshPolicy, service: MeshService): Json[] {
  if (!policy.mtls) return [];
  return [
    {
      name: 'envoy.filters.http.rbac',
      typed_config: any(RBAC_FILTER_TYPE, { rules: { policies: rbacPolicies(policy, service) } }),
    },
  ];
}

/** One file-based SDS file: its name in `sidecar.configDir` and its content, a DiscoveryResponse with one Secret. */
export interface SdsFile {
  fileName: string;
  secret: string;
  /** An `envoy.service.discovery.v3.DiscoveryResponse`. */
  response: Json;
}

/**
 * The SDS files every sidecar reads (the same for all: they name the files of the instance's own
 * identity folder); none without mTLS. Each secret watches `identity.certificateDir`, so a rotation
 * there (files swapped in by a rename, as cert-manager's CSI driver does) is taken at once.
 */
export function sdsFiles(policy: MeshPolicy): SdsFile[] {
  if (!policy.mtls) return [];
  const dir = policy.identity.certificateDir.replace(/\/$/, '');
  const watched = { path: policy.identity.certificateDir };
  const secret = (name: keyof typeof SDS_FILES, content: Json): SdsFile => ({
    fileName: SDS_FILES[name],
    secret: name,
    response: { resources: [any('envoy.extensions.transport_sockets.tls.v3.Secret', { name, ...content })] },
  });
  return [
    secret(IDENTITY_SECRET, {
      tls_certificate: {
        certificate_chain: { filename: `${dir}/cert.pem` },
        private_key: { filename: `${dir}/key.pem` },
        watched_directory: watched,
      },
    }),
    secret(TRUST_BUNDLE_SECRET, {
      validation_context: { trusted_ca: { filename: `${dir}/ca.pem` }, watched_directory: watched },
    }),
  ];
}
