import { stringify } from 'yaml';
import { type EnvoyMode, envoyBootstrap } from './envoy-bootstrap';
import { sdsFiles } from './envoy-security';
import { MESH_SERVICES, type MeshPolicy, type MeshService } from './mesh-policy';

/** One sidecar's configuration file: `<service>.yaml`, or `<service>.<subset>.yaml` for the pods of a subset that differ. */
export interface EnvoyConfigFile {
  service: MeshService;
  subset: string | undefined;
  fileName: string;
  bootstrap: Record<string, unknown>;
  text: string;
}

/**
 * Every service's sidecar bootstrap as YAML text, each file saying where it comes from. A service
 * whose inbound fault targets one subset gets a second file for that subset's pods.
 */
export function envoyConfigFiles(
  policy: MeshPolicy,
  mode: EnvoyMode,
  policySource = 'envoy/mesh.yaml',
): EnvoyConfigFile[] {
  return MESH_SERVICES.flatMap((service) => {
    const faultSubset = policy.services[service].inboundFault?.subset;
    return [undefined, ...(faultSubset === undefined ? [] : [faultSubset])].map((subset) => {
      const bootstrap = envoyBootstrap(policy, service, mode, subset);
      const who = subset === undefined ? `the ${service}` : `the ${service}'s pods of subset ${subset}`;
      const header =
        `# Envoy sidecar of ${who} (${mode === 'ads' ? 'listeners and clusters over ADS from the registry' : 'everything static, upstreams by DNS'}).\n` +
        `# Generated from ${policySource} by \`npx infermesh mesh envoy --mode ${mode}\`: do not edit, change the policy.\n`;
      const fileName = subset === undefined ? `${service}.yaml` : `${service}.${subset}.yaml`;
      return {
        service,
        subset,
        fileName,
        bootstrap,
        text: header + stringify(bootstrap, { lineWidth: 0, aliasDuplicateObjects: false }),
      };
    });
  });
}

/** One file-based SDS file every sidecar reads from `sidecar.configDir` (mounted with the bootstraps). */
export interface EnvoySdsFile {
  fileName: string;
  /** An `envoy.service.discovery.v3.DiscoveryResponse` holding one Secret. */
  response: Record<string, unknown>;
  text: string;
}

/**
 * The SDS files the sidecars' TLS contexts name (`sds-identity.yaml`, `sds-trust-bundle.yaml`), the
 * same for every service; none without mTLS. They go into the folder the bootstraps are mounted from.
 */
export function envoySdsFiles(policy: MeshPolicy, policySource = 'envoy/mesh.yaml'): EnvoySdsFile[] {
  return sdsFiles(policy).map((file) => {
    const header =
      `# SDS secret ${file.secret} of every sidecar (file-based SDS: Envoy reads it from ${policy.sidecar.configDir}, and rereads the\n` +
      `# files it names when ${policy.identity.certificateDir} changes). Generated from ${policySource} by \`npx infermesh mesh envoy\`.\n`;
    return {
      fileName: file.fileName,
      response: file.response,
      text: header + stringify(file.response, { lineWidth: 0, aliasDuplicateObjects: false }),
    };
  });
}
