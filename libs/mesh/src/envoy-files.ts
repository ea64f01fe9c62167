import { stringify } from 'yaml';
import { type EnvoyMode, envoyBootstrap } from './envoy-bootstrap';
import { MESH_SERVICES, type MeshPolicy, type MeshService } from './mesh-policy';

/** One sidecar's configuration file: `<service>.yaml`. */
export interface EnvoyConfigFile {
  service: MeshService;
  fileName: string;
  bootstrap: Record<string, unknown>;
  text: string;
}

/** Every service's sidecar bootstrap as YAML text, each file saying where it comes from. */
export function envoyConfigFiles(policy: MeshPolicy, mode: EnvoyMode, policySource = 'envoy/mesh.yaml'): EnvoyConfigFile[] {
  return MESH_SERVICES.map((service) => {
    const bootstrap = envoyBootstrap(policy, service, mode);
    const header =
      `# Envoy sidecar of the ${service} (${mode === 'ads' ? 'listeners and clusters over ADS from the registry' : 'everything static, upstreams by DNS'}).\n` +
      `# Generated from ${policySource} by \`npx infermesh mesh envoy --mode ${mode}\`: do not edit, change the policy.\n`;
    return { service, fileName: `${service}.yaml`, bootstrap, text: header + stringify(bootstrap, { lineWidth: 0, aliasDuplicateObjects: false }) };
  });
}
