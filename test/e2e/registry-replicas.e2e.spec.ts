import type { MessageInitShape } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { type AnnounceRequestSchema, InstanceService } from '@infermesh/proto/gen/infermesh/mesh/v1/instances_pb';
import { freePortList, type RedisServer, startRedisServer } from '@infermesh/testing';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DIST, REPO_ROOT } from './support/system-fixture';

type Instances = ReturnType<typeof createClient<typeof InstanceService>>;

/**
 * Two registries (the mesh's control plane) as real processes sharing one Redis, as the production
 * overlay runs three: an instance announced to either is listed, and served over xDS, by both; when
 * one is killed (SIGKILL, no clean-up), the instances announced to it expire from the other within
 * the instance timeout, while those announced to the survivor stay.
 */
describe('registry replicas share the mesh instances through Redis', () => {
  const TIMEOUT_MS = 2_000;
  let redis: RedisServer;
  let dir: string;
  const processes: ChildProcess[] = [];
  const clients: Instances[] = [];
  let a: { process: ChildProcess; client: Instances };
  let b: { process: ChildProcess; client: Instances };

  async function startRegistry(name: string): Promise<{ process: ChildProcess; client: Instances }> {
    const [grpcPort, metricsPort] = await freePortList(2);
    const child = spawn(process.execPath, [join(DIST, 'services', 'registry', 'src', 'main.js')], {
      env: {
        ...process.env,
        REGISTRY_GRPC_PORT: String(grpcPort),
        REGISTRY_METRICS_PORT: String(metricsPort),
        REGISTRY_DATA_DIR: join(dir, name),
        REGISTRY_MESH_POLICY: join(REPO_ROOT, 'envoy', 'mesh.yaml'),
        REGISTRY_INSTANCE_TIMEOUT_MS: String(TIMEOUT_MS),
        REGISTRY_LOG_LEVEL: 'warn',
        REDIS_URL: redis.url,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    processes.push(child);
    const client = createClient(InstanceService, `127.0.0.1:${grpcPort}`);
    clients.push(client);
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await client.listInstances({}, { timeoutMs: 1_000 });
        return { process: child, client };
      } catch (error) {
        if (child.exitCode !== null || Date.now() > deadline)
          throw new Error(`registry ${name} did not start: ${String(error)}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  /** Announces a worker to one registry, with a heartbeat every 300 ms, until `end()` (or the registry dies). */
  function announce(registry: Instances, id: string, address: string) {
    let ended = false;
    async function* messages(): AsyncGenerator<MessageInitShape<typeof AnnounceRequestSchema>> {
      yield { instance: { service: 'worker', id, address, port: 15006, labels: {} }, serving: true };
      while (!ended) {
        await new Promise((r) => setTimeout(r, 300));
        yield { serving: true };
      }
    }
    const stream = registry.announce(messages(), { timeoutMs: 600_000 }).catch(() => undefined);
    return {
      end: async () => {
        ended = true;
        await stream;
      },
    };
  }

  const listed = async (registry: Instances) =>
    (await registry.listInstances({}, { timeoutMs: 2_000 })).instances
      .map((i) => `${i.instance!.id}@${i.instance!.address}`)
      .sort()
      .join(',');

  async function until(registry: Instances, expected: string, timeoutMs = 10_000): Promise<void> {
    let last = '';
    const deadline = Date.now() + timeoutMs;
    while ((last = await listed(registry)) !== expected) {
      if (Date.now() > deadline) throw new Error(`listed "${last}", expected "${expected}" within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  beforeAll(async () => {
    redis = await startRedisServer();
    dir = mkdtempSync(join(tmpdir(), 'registry-replicas-'));
    [a, b] = await Promise.all([startRegistry('a'), startRegistry('b')]);
  }, 60_000);

  afterAll(async () => {
    for (const client of clients) client.close();
    for (const child of processes) if (child.exitCode === null) child.kill('SIGKILL');
    await redis?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('an instance announced to one registry is listed by the other, and leaves both when its announcement ends', async () => {
    const w0 = announce(a.client, 'worker-0', '10.0.0.1');
    const w1 = announce(b.client, 'worker-1', '10.0.0.2');

    await until(a.client, 'worker-0@10.0.0.1,worker-1@10.0.0.2');
    await until(b.client, 'worker-0@10.0.0.1,worker-1@10.0.0.2');
    await w0.end();
    await until(b.client, 'worker-1@10.0.0.2');
    await w1.end();
    await until(a.client, '');
  }, 30_000);

  it('a registry killed with SIGKILL: what was announced to it expires from the survivor, the rest stays, and it announces again there', async () => {
    const onA = announce(a.client, 'worker-2', '10.0.0.3');
    const onB = announce(b.client, 'worker-3', '10.0.0.4');
    await until(b.client, 'worker-2@10.0.0.3,worker-3@10.0.0.4');

    a.process.kill('SIGKILL');
    await onA.end();
    const killedAt = Date.now();
    // Still listed until its entry expires (no registry refreshes it), then gone: within the timeout and a poll.
    await until(b.client, 'worker-3@10.0.0.4', TIMEOUT_MS + 5_000);
    expect(Date.now() - killedAt).toBeLessThan(TIMEOUT_MS + 5_000);
    // The instance announces itself again, to the registry that is left.
    const again = announce(b.client, 'worker-2', '10.0.0.3');
    await until(b.client, 'worker-2@10.0.0.3,worker-3@10.0.0.4');
    await Promise.all([again.end(), onB.end()]);
  }, 30_000);
});
