import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Fixture, inferTinyDistinct, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

const POLICY = readFileSync(join(REPO_ROOT, 'envoy', 'mesh.yaml'), 'utf8');

/**
 * The shipped policy with aborts injected on the router → batcher edge. An injected abort is the
 * caller's own answer, before any routing, so no retry follows it (as in Envoy).
 */
function withBatcherFault(percent: number): string {
  const edge = '  - from: router\n    to: batcher\n';
  if (!POLICY.includes(edge)) throw new Error('envoy/mesh.yaml has no router -> batcher edge');
  return POLICY.replace(edge, `${edge}    fault: { abort: { percent: ${percent}, grpcStatus: UNAVAILABLE } }\n`);
}

/**
 * The six services in the mesh, as processes: each announces itself to the registry, and the
 * gateway → router and router → cache/batcher calls go through `xds:///<service>` with the
 * policy's routes and faults, which change at run time with the policy file.
 */
describe('the services reach each other through the mesh', () => {
  let fixture: Fixture;
  let dir: string;
  let policyFile: string;

  const infer = () => inferTinyDistinct(fixture.system.gatewayUrl);

  /** `clients` closed loops for `ms`: every status they got. */
  const load = async (clients: number, ms: number) => {
    const statuses: number[] = [];
    const end = Date.now() + ms;
    await Promise.all(
      Array.from({ length: clients }, async () => {
        while (Date.now() < end) statuses.push(await infer());
      }),
    );
    return statuses;
  };

  const applyPolicy = async (text: string) => {
    const registry = fixture.system.metricsUrl('registry');
    const before = await metricValue(registry, 'infermesh_registry_mesh_policy_changes_total', { outcome: 'applied' });
    writeFileSync(policyFile, text);
    const deadline = Date.now() + 10_000;
    while (
      (await metricValue(registry, 'infermesh_registry_mesh_policy_changes_total', { outcome: 'applied' })) === before
    ) {
      if (Date.now() > deadline) throw new Error(`the registry did not apply the policy change\n${fixture.logTail()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    await new Promise((r) => setTimeout(r, 500)); // pushed at once; give the clients a moment to apply it
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mesh-system-'));
    policyFile = join(dir, 'mesh.yaml');
    writeFileSync(policyFile, POLICY);
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: policyFile,
      // Only the mesh retries: the router's own retries of UNAVAILABLE would hide what the policy does.
      // The injected aborts open tiny's circuit in the router (as a failing batcher would): keep it short.
      env: {
        ROUTER_RETRY_ATTEMPTS: '0',
        ROUTER_BREAKER_COOLDOWN_MS: '300',
        REGISTRY_MESH_POLICY_POLL_MS: '100',
        ROUTER_CACHE_ENABLED: 'false',
      },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('serves through xds:/// targets, every service announced and serving', async () => {
    expect(await infer()).toBe(200);
    const registry = fixture.system.metricsUrl('registry');
    for (const service of ['registry', 'cache', 'worker', 'batcher', 'router', 'gateway']) {
      expect(await metricValue(registry, 'infermesh_registry_mesh_instances', { service, serving: 'true' })).toBe(1);
    }
    expect(await metricValue(registry, 'infermesh_registry_xds_clients')).toBeGreaterThanOrEqual(2); // the gateway's and the router's
    expect(readFileSync(fixture.logFile, 'utf8')).toContain('serving xDS (ADS) for the mesh policy');
  });

  it("applies the policy's fault injection at run time: every router → batcher call aborted when it says 100 %", async () => {
    await applyPolicy(withBatcherFault(100));

    const statuses = await Promise.all(Array.from({ length: 10 }, () => infer()));

    expect(statuses).toEqual(Array(10).fill(503));
  });

  it('takes the fault out again when the policy does: every request served, and no client refused an update', async () => {
    await applyPolicy(POLICY);
    const deadline = Date.now() + 10_000;
    while ((await infer()) !== 200 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100)); // the circuit closes again

    const statuses = await load(4, 3_000);

    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expect(statuses.length).toBeGreaterThan(20);
    expect(
      await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_xds_events_total', {
        event: 'nack',
      }),
    ).toBe(0);
  });
});
