import { MESH_SERVICES, parseMeshPolicy } from '@infermesh/mesh';
import { DEFAULT_PORTS } from '@infermesh/system';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import { MESH_CONFIG_MAP_FILE, meshConfigMapFiles } from './k8s/k8s-files';
import { runCapturing } from './testing/cli-runner';

const ENVOY = join(__dirname, '..', '..', '..', 'envoy');
const POLICY = join(ENVOY, 'mesh.yaml');

describe('infermesh mesh', () => {
  let out: string;

  beforeEach(() => {
    out = mkdtempSync(join(tmpdir(), 'mesh-cli-'));
  });

  afterEach(() => {
    rmSync(out, { recursive: true, force: true });
  });

  it('the shipped policy gives each service the port it listens on without a mesh (infermesh up)', () => {
    const policy = parseMeshPolicy(readFileSync(POLICY, 'utf8'));
    const expected = {
      registry: DEFAULT_PORTS.registry,
      cache: DEFAULT_PORTS.cache,
      worker: DEFAULT_PORTS.worker,
      batcher: DEFAULT_PORTS.batcher,
      router: DEFAULT_PORTS.router,
      gateway: DEFAULT_PORTS.gatewayGrpc,
    };
    expect(Object.fromEntries(MESH_SERVICES.map((s) => [s, policy.services[s].port]))).toEqual(expected);
  });

  it.each(['ads', 'static'])(
    'envoy --mode %s writes one <service>.yaml per service and the SDS files, the checked-in goldens',
    async (mode) => {
      const run = await runCapturing(['mesh', 'envoy', '--mode', mode, '--out', out, '--policy', POLICY], {});

      expect(run.code).toBe(0);
      expect(run.stderr).toContain(`wrote 6 Envoy configurations (${mode})`);
      for (const file of [
        ...MESH_SERVICES.map((service) => `${service}.yaml`),
        'sds-identity.yaml',
        'sds-trust-bundle.yaml',
      ]) {
        // The goldens: envoy/generated/static; for ADS, the mesh ConfigMap the Kubernetes sidecars mount.
        const golden =
          mode === 'static'
            ? readFileSync(join(ENVOY, 'generated', mode, file), 'utf8')
            : meshConfigMapFiles(parse(readFileSync(join(ENVOY, '..', MESH_CONFIG_MAP_FILE), 'utf8')))[file];
        expect(readFileSync(join(out, file), 'utf8')).toBe(golden);
      }
      expect(run.stderr).toContain('and 2 SDS files (sds-identity.yaml, sds-trust-bundle.yaml, for /etc/envoy)');
    },
  );

  it('envoy refuses a bad policy with exit 1, naming the field, and writes nothing', async () => {
    const bad = join(out, 'bad.yaml');
    writeFileSync(bad, readFileSync(POLICY, 'utf8').replace('timeout: 60s', 'timeout: -60s'));

    const run = await runCapturing(['mesh', 'envoy', '--out', join(out, 'generated'), '--policy', bad], {});

    expect(run.code).toBe(1);
    expect(run.stderr).toContain('defaults.timeout: must be zero or more (got "-60s")');
    expect(() => readFileSync(join(out, 'generated', 'gateway.yaml'))).toThrow();
  });

  it('check passes the goldens and fails a broken file with exit 1, each problem with its path', async () => {
    const good = await runCapturing(['mesh', 'check', join(ENVOY, 'generated', 'static', 'router.yaml')], {});
    const broken = await runCapturing(
      [
        'mesh',
        'check',
        join(ENVOY, 'testdata', 'broken', 'bad-enum.yaml'),
        join(ENVOY, 'testdata', 'valid-bootstrap.yaml'),
      ],
      {},
    );

    const sds = await runCapturing(['mesh', 'check', join(ENVOY, 'generated', 'static', 'sds-identity.yaml')], {});

    expect(good.code).toBe(0);
    expect(good.stdout).toMatch(/router\.yaml: ok\n$/);
    expect(sds.stdout).toMatch(/sds-identity\.yaml: ok\n$/);
    expect(broken.code).toBe(1);
    expect(broken.stdout).toContain(
      'bad-enum.yaml: static_resources.clusters[0].lb_policy: "LEAST_REQUESTS" is not a value',
    );
    expect(broken.stdout).toContain('valid-bootstrap.yaml: ok');
    expect(broken.stderr).toContain("1 of 2 files fail Envoy's API check");
  });

  it('envoy without --out is a usage error', async () => {
    const run = await runCapturing(['mesh', 'envoy'], {});
    expect(run.code).toBe(2);
  });
});
