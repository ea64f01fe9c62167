import type { MessageInitShape } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { type AnnounceRequestSchema, InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { startXdsProbe, type XdsProbe } from '@infermesh/testing';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Fixture, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

const POLICY = readFileSync(join(REPO_ROOT, 'envoy', 'mesh.yaml'), 'utf8');
/** grpc.health.v1.HealthCheckResponse{status: SERVING}, hex. */
const SERVING = '0801';

/**
 * The registry as the mesh's control plane, on real processes: the router announces itself, a
 * proxyless grpc-js-xds client of the gateway's side reaches it through `xds:///router` with the
 * policy's routes, and policy changes on disk reach that client without a restart, or are refused.
 */
describe('the registry serves the mesh over xDS', () => {
  let fixture: Fixture;
  let dir: string;
  let policyFile: string;
  let probe: XdsProbe;
  let instances: ReturnType<typeof createClient<typeof InstanceService>>;

  /** Announces the fixture's router until `withdraw` is called; resolves when the announcement ends. */
  const announceRouter = () => {
    let withdraw!: () => void;
    const withdrawn = new Promise<void>((resolve) => (withdraw = resolve));
    async function* messages(): AsyncGenerator<MessageInitShape<typeof AnnounceRequestSchema>> {
      const port = Number(fixture.system.grpcAddress('router').split(':').at(-1));
      yield {
        instance: { service: 'router', id: 'router-0', address: '127.0.0.1', port, labels: { track: 'stable' } },
        serving: true,
      };
      await withdrawn;
    }
    const ended = instances.announce(messages(), { timeoutMs: 600_000 });
    return { withdraw, ended };
  };

  /** Polls until `check` holds for a tally of 5 calls; returns the last tally. */
  const eventually = async (check: (counts: Record<string, number>) => boolean, timeoutMs = 10_000) => {
    const deadline = Date.now() + timeoutMs;
    let counts = await probe.tally(5);
    while (!check(counts) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      counts = await probe.tally(5);
    }
    return counts;
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mesh-e2e-'));
    policyFile = join(dir, 'mesh.yaml');
    writeFileSync(policyFile, POLICY);
    fixture = await startFixture({
      models: ['tiny'],
      env: {
        REGISTRY_MESH_POLICY: policyFile,
        REGISTRY_MESH_POLICY_POLL_MS: '100',
        REGISTRY_INSTANCE_TIMEOUT_MS: '5000',
      },
    });
    instances = createClient(InstanceService, fixture.system.grpcAddress('registry'));
    probe = startXdsProbe({
      controlPlane: fixture.system.grpcAddress('registry'),
      caller: 'gateway',
      target: 'xds:///router',
      method: '/grpc.health.v1.Health/Check',
      format: 'hex',
    });
  }, 120_000);

  afterAll(async () => {
    probe?.close();
    instances?.close();
    await fixture?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends the gateway side to the router once it announces itself, and nowhere once it withdraws', async () => {
    const announcement = announceRouter();

    const up = await eventually((c) => c[SERVING] === 5);
    expect(up).toEqual({ [SERVING]: 5 });
    expect(
      await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_mesh_instances', {
        service: 'router',
        serving: 'true',
      }),
    ).toBe(1);

    announcement.withdraw();
    await announcement.ended;
    const down = await eventually((c) => c[SERVING] === undefined);
    expect(down).toEqual({ 'error UNAVAILABLE': 5 });
  });

  it('refuses a policy change that does not validate, naming the field, and keeps serving the running one', async () => {
    const announcement = announceRouter();
    await eventually((c) => c[SERVING] === 5);
    const refusedBefore = await metricValue(
      fixture.system.metricsUrl('registry'),
      'infermesh_registry_mesh_policy_changes_total',
      { outcome: 'refused' },
    );

    writeFileSync(policyFile, POLICY.replace('timeout: 60s', 'timeout: -60s'));
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (
        (await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_mesh_policy_changes_total', {
          outcome: 'refused',
        })) > refusedBefore
      )
        break;
      await new Promise((r) => setTimeout(r, 100));
    }

    expect(
      await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_mesh_policy_changes_total', {
        outcome: 'refused',
      }),
    ).toBe(refusedBefore + 1);
    expect(readFileSync(fixture.logFile, 'utf8')).toContain('defaults.timeout: must be zero or more');
    expect(await probe.tally(10)).toEqual({ [SERVING]: 10 });
    announcement.withdraw();
    await announcement.ended;
  });

  it('pushes a valid change to the running client within seconds: a fault the policy injects, then its removal', async () => {
    const announcement = announceRouter();
    await eventually((c) => c[SERVING] === 5);

    writeFileSync(
      policyFile,
      POLICY.replace(
        '  - from: gateway\n    to: router\n',
        '  - from: gateway\n    to: router\n    fault: { abort: { percent: 100, grpcStatus: RESOURCE_EXHAUSTED } }\n    retry: { attempts: 1 }\n',
      ),
    );
    const started = Date.now();
    const faulted = await eventually((c) => c['error RESOURCE_EXHAUSTED'] === 5);
    const tookMs = Date.now() - started;
    console.log(`a policy change on disk reached the xDS client in ${tookMs} ms`);
    expect(faulted).toEqual({ 'error RESOURCE_EXHAUSTED': 5 });

    writeFileSync(policyFile, POLICY);
    expect(await eventually((c) => c[SERVING] === 5)).toEqual({ [SERVING]: 5 });
    expect(
      await metricValue(fixture.system.metricsUrl('registry'), 'infermesh_registry_xds_events_total', {
        event: 'nack',
      }),
    ).toBe(0);
    announcement.withdraw();
    await announcement.ended;
  });
});
