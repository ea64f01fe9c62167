import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Fixture, inferTinyDistinct, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

const POLICY = readFileSync(join(REPO_ROOT, 'envoy', 'mesh.yaml'), 'utf8');

/** The shipped policy with the gateway → router traffic split between the stable and next routers. */
function split(stable: number, next: number): string {
  const edge = '  - from: gateway\n    to: router\n';
  if (!POLICY.includes(edge)) throw new Error('envoy/mesh.yaml has no gateway -> router edge');
  return POLICY.replace(
    edge,
    `${edge}    split: [{ subset: stable, weight: ${stable} }, { subset: next, weight: ${next} }]\n`,
  );
}

/**
 * Two builds of the router side by side (labelled track=stable and track=next), the gateway's traffic
 * split between them by the mesh policy, and the split changed while clients send.
 */
describe('a traffic split between two subsets of the router', () => {
  let fixture: Fixture;
  let dir: string;
  let policyFile: string;

  /** Requests each router instance has answered so far. */
  const served = async () => {
    const count = async (i: number) =>
      metricValue(fixture.system.instanceMetricsUrl('router', i), 'infermesh_router_requests_total', { model: 'tiny' });
    return { stable: await count(0), next: await count(1) };
  };

  /** `clients` closed loops until `total` requests are done: every status. */
  const send = async (total: number, clients = 16) => {
    const statuses: number[] = [];
    let left = total;
    await Promise.all(
      Array.from({ length: clients }, async () => {
        while (left > 0) {
          left -= 1;
          statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
        }
      }),
    );
    return statuses;
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mesh-split-'));
    policyFile = join(dir, 'mesh.yaml');
    writeFileSync(policyFile, split(90, 10));
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: policyFile,
      replicas: {
        router: [
          { env: { INFERMESH_INSTANCE_LABELS: 'track=stable' } },
          { env: { INFERMESH_INSTANCE_LABELS: 'track=next' } },
        ],
      },
      env: { REGISTRY_MESH_POLICY_POLL_MS: '100', ROUTER_LOCAL_CACHE_ENABLED: 'false' },
    });
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends 10 % ± 1.5 % of 10,000 requests to the next router at 90/10', async () => {
    const before = await served();

    const statuses = await send(10_000);

    const after = await served();
    const next = after.next - before.next;
    const stable = after.stable - before.stable;
    const share = next / (next + stable);
    console.log(
      `90/10 split: ${stable} requests to the stable router, ${next} to the next one (${(share * 100).toFixed(2)} %); ${statuses.filter((s) => s !== 200).length} failed`,
    );
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expect(next + stable).toBe(10_000);
    expect(share).toBeGreaterThanOrEqual(0.085);
    expect(share).toBeLessThanOrEqual(0.115);
  }, 120_000);

  it('changes to 50/50 while clients send: in effect within 2 s, no request failed', async () => {
    const statuses: number[] = [];
    let sending = true;
    const clients = Array.from({ length: 8 }, async () => {
      while (sending) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    await new Promise((r) => setTimeout(r, 1_000));

    writeFileSync(policyFile, split(50, 50));
    const changedAt = Date.now();
    await new Promise((r) => setTimeout(r, 2_000));
    const from = await served();
    await new Promise((r) => setTimeout(r, 4_000));
    const to = await served();
    sending = false;
    await Promise.all(clients);

    const next = to.next - from.next;
    const stable = to.stable - from.stable;
    const share = next / (next + stable);
    console.log(
      `changed to 50/50 ${((Date.now() - changedAt) / 1000).toFixed(1)} s ago: from 2 s after the change, ${stable} to stable and ${next} to next (${(share * 100).toFixed(1)} %); ${statuses.length} requests, ${statuses.filter((s) => s !== 200).length} failed`,
    );
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expect(share).toBeGreaterThan(0.4);
    expect(share).toBeLessThan(0.6);
  }, 60_000);
});
