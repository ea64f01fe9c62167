import { EnvoyApi } from '@infermesh/mesh';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SHIPPED_OVERLAYS } from '../k8s.command';
import { k8sGeneratedFiles, MESH_CONFIG_MAP_FILE } from './k8s-files';
import { renderKustomization } from './kustomize';
import { autoscalerMetrics, checkManifests, type K8sObject } from './manifest-checks';

// Renders with the real `kubectl kustomize` (.ci/run installs kubectl): without it these tests fail, naming it.
const ROOT = join(__dirname, '..', '..', '..', '..');
const BROKEN = join(ROOT, 'k8s', 'testdata', 'broken');

let envoy: EnvoyApi;
const rendered = new Map<string, Promise<K8sObject[]>>();
const render = (dir: string) => {
  if (!rendered.has(dir)) rendered.set(dir, renderKustomization(join(ROOT, dir)));
  return rendered.get(dir)!;
};

beforeAll(() => {
  envoy = EnvoyApi.load();
});

describe('the shipped overlays', () => {
  it.each(SHIPPED_OVERLAYS.map((o) => [o.dir, o.production] as const))('%s renders and passes every check (production rules: %s)', async (dir, production) => {
    const objects = await render(dir);

    expect(checkManifests(objects, { production, envoy })).toEqual([]);
    // What the checks looked at: six mesh services, each with its sidecar, in the policy's namespace.
    const deployments = objects.filter((o) => o.kind === 'Deployment');
    expect(deployments.map((d) => d.metadata.name).sort()).toEqual(['batcher', 'cache', 'gateway', 'registry', 'router', 'worker']);
    expect(deployments.every((d) => d.metadata.namespace === 'infermesh')).toBe(true);
  }, 60_000);

  it('production: three replicas per tier, the registry too, autoscaled on the batcher queue and the workers in flight', async () => {
    const objects = await render('k8s/overlays/production');
    const replicas = Object.fromEntries(objects.filter((o) => o.kind === 'Deployment').map((d) => [d.metadata.name, (d as unknown as { spec: { replicas: number } }).spec.replicas]));

    // batcher and worker: no count of their own, their autoscalers start them at 3.
    expect(replicas).toEqual({ registry: 3, router: 3, cache: 3, batcher: undefined, worker: undefined, gateway: 3 });
    expect(autoscalerMetrics(objects)).toEqual([
      { object: 'ScaledObject/batcher', metric: 'infermesh_batcher_queue_depth' },
      { object: 'ScaledObject/worker', metric: 'infermesh_batcher_queue_oldest_age_seconds' },
      { object: 'ScaledObject/worker', metric: 'infermesh_worker_inference_requests_in_flight' },
    ]);
  }, 60_000);

  it('gpu: the workers ask for a GPU, run the CUDA image and provider, and scale on GPU use too', async () => {
    const objects = await render('k8s/overlays/gpu');
    const worker = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'worker') as unknown as { spec: { template: { spec: { containers: { image: string; env: { name: string; value?: string }[]; resources: { limits: Record<string, string> } }[]; tolerations: unknown[] } } } };
    const app = worker.spec.template.spec.containers[0]!;

    expect(app.image).toBe('ghcr.io/infermesh/infermesh:0.1.0-gpu');
    expect(app.resources.limits['nvidia.com/gpu']).toBe('1');
    expect(app.env.filter((e) => e.name === 'WORKER_EXECUTION_PROVIDERS').at(-1)?.value).toBe('cuda,cpu');
    expect(autoscalerMetrics(objects).map((m) => m.metric)).toContain('infermesh_worker_gpu_utilization_ratio');
  }, 60_000);
});

describe('each broken fixture fails the check that guards it, naming the object', () => {
  const fixtures = readdirSync(BROKEN).sort();

  it('there is one for each check', () => {
    expect(fixtures.length).toBeGreaterThanOrEqual(20);
  });

  it.each(fixtures)('%s', async (name) => {
    const text = readFileSync(join(BROKEN, name, 'kustomization.yaml'), 'utf8');
    const expected = /^# expect: (\S+): (.+)$/m.exec(text);
    if (expected === null) throw new Error(`${name}/kustomization.yaml has no "# expect: <Kind>/<name>: <message>" line`);
    const objects = await renderKustomization(join(BROKEN, name));

    const problems = checkManifests(objects, { production: text.includes('overlays/production'), envoy });

    expect(problems).toContainEqual({ object: expected[1], message: expect.stringContaining(expected[2]!) });
  }, 60_000);
});

describe('the mesh policy in the ConfigMap', () => {
  it('each service needs an edge to the registry: its sidecar has no listener for the control plane otherwise', async () => {
    const objects = structuredClone(await render('k8s/overlays/local'));
    const configMap = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'infermesh-mesh') as unknown as { data: Record<string, string> };
    const policy = configMap.data['mesh.yaml']!;
    expect(policy).toContain('- from: [gateway, router, cache, batcher, worker]\n    to: registry');
    configMap.data['mesh.yaml'] = policy.replace('- from: [gateway, router, cache, batcher, worker]\n    to: registry', '- from: [gateway, router, batcher, worker]\n    to: registry');

    expect(checkManifests(objects, { production: false, envoy })).toEqual([
      { object: 'ConfigMap/infermesh-mesh', message: "mesh.yaml has no edge from cache to registry: cache's sidecar would have no listener for the control plane it announces itself to" },
    ]);
  }, 60_000);
});

describe('the generated files under k8s/', () => {
  it.each(k8sGeneratedFiles(ROOT).map((f) => [f.path, f.text] as const))('%s is up to date (regenerate with `npx infermesh k8s generate`)', (path, text) => {
    expect(readFileSync(join(ROOT, path), 'utf8')).toBe(text);
  });

  it('the mesh ConfigMap carries the policy as it is, byte for byte', () => {
    expect(readFileSync(join(ROOT, MESH_CONFIG_MAP_FILE), 'utf8')).toContain('kind: ConfigMap');
    const files = k8sGeneratedFiles(ROOT);
    expect(files.find((f) => f.path === MESH_CONFIG_MAP_FILE)?.text).toContain(readFileSync(join(ROOT, 'envoy', 'mesh.yaml'), 'utf8').split('\n')[0]);
  });
});
