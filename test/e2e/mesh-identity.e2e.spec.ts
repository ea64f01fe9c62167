import type { DescService } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { toServiceDefinition } from '@infermesh/grpc';
import { LocalCa } from '@infermesh/identity';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { type Fixture, inferTinyDistinct, metricValue, REPO_ROOT, startFixture } from './support/system-fixture';

const POLICY = join(REPO_ROOT, 'envoy', 'mesh.yaml');

/** What a probe presents: nothing (plaintext), TLS without a certificate, or a certificate and key. */
type Presented = 'plaintext' | 'no certificate' | { certPem: string; keyPem: string };

interface Outcome {
  code: grpc.status;
  details: string;
}

/** One unary call to `method` of `service` at `address`, as a client presenting `presented` and trusting `caPem`. */
async function probe(
  address: string,
  service: DescService,
  method: string,
  request: object,
  presented: Presented,
  caPem: string,
): Promise<Outcome> {
  const credentials =
    presented === 'plaintext'
      ? grpc.credentials.createInsecure()
      : grpc.credentials.createSsl(
          Buffer.from(caPem),
          presented === 'no certificate' ? null : Buffer.from(presented.keyPem),
          presented === 'no certificate' ? null : Buffer.from(presented.certPem),
          { checkServerIdentity: () => undefined },
        );
  const Client = grpc.makeGenericClientConstructor(toServiceDefinition(service), service.typeName);
  const client = new Client(address, credentials, {
    'grpc.ssl_target_name_override': 'probe.infermesh.local',
  }) as unknown as Record<string, (...args: unknown[]) => void> & grpc.Client;
  try {
    return await new Promise<Outcome>((resolve) => {
      client[method]!.call(
        client,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + 5_000 },
        (error: grpc.ServiceError | null) =>
          resolve(
            error === null ? { code: grpc.status.OK, details: '' } : { code: error.code, details: error.details },
          ),
      );
    });
  } finally {
    client.close();
  }
}

/**
 * Mutual TLS and authorization by identity, on real processes: every internal port refuses a client
 * that does not prove a mesh identity, and each method refuses the identities the policy does not
 * name; the request path keeps working, also while every certificate rotates.
 */
describe('service identity: mutual TLS and authorization between the services', () => {
  let fixture: Fixture;
  let dataDir: string;
  let ca: LocalCa;
  let caPem: string;
  let otherCa: LocalCa;
  let otherDir: string;

  beforeAll(async () => {
    fixture = await startFixture({
      models: ['tiny'],
      meshPolicyFile: POLICY,
      mtls: { lifetimeMs: 20_000, refreshMs: 1_000 },
    });
    dataDir = fixture.system.options.dataDir;
    ca = await LocalCa.open(join(dataDir, 'identity-ca'));
    caPem = ca.bundlePem;
    otherDir = mkdtempSync(join(tmpdir(), 'other-ca-'));
    otherCa = await LocalCa.open(otherDir);
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    rmSync(otherDir, { recursive: true, force: true });
  });

  const as = (service: string) => ca.issue({ service, instance: `probe-${service}` }, 600_000);
  /** Each internal port, one of its methods, who may call it and who may not. */
  const targets = () =>
    [
      {
        callee: 'registry',
        address: fixture.system.grpcAddress('registry'),
        service: RegistryService,
        method: 'listModels',
        allowed: 'worker',
        refused: 'cache',
      },
      {
        callee: 'router',
        address: fixture.system.grpcAddress('router'),
        service: RouterService,
        method: 'infer',
        allowed: 'gateway',
        refused: 'worker',
      },
      {
        callee: 'cache',
        address: fixture.system.grpcAddress('cache'),
        service: CacheService,
        method: 'lookup',
        allowed: 'router',
        refused: 'gateway',
      },
      {
        callee: 'batcher',
        address: fixture.system.grpcAddress('batcher'),
        service: BatcherService,
        method: 'infer',
        allowed: 'router',
        refused: 'gateway',
      },
      {
        callee: 'worker',
        address: fixture.system.grpcAddress('worker'),
        service: WorkerService,
        method: 'listModels',
        allowed: 'batcher',
        refused: 'router',
      },
    ] as const;

  it('serves the request path through the mesh with mutual TLS on every hop', async () => {
    const statuses = await Promise.all(Array.from({ length: 50 }, () => inferTinyDistinct(fixture.system.gatewayUrl)));
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
  }, 30_000);

  it('refuses, on every internal port, a client without a certificate, with one from another CA, and one with an expired certificate', async () => {
    const foreign = await otherCa.issue({ service: 'gateway', instance: 'impostor' }, 600_000);
    const expired = await ca.issue({ service: 'gateway', instance: 'expired' }, 1_000);
    await new Promise((r) => setTimeout(r, 2_500));
    const lines: string[] = [];
    for (const target of targets()) {
      const before = await metricValue(
        fixture.system.metricsUrl(target.callee),
        `infermesh_${target.callee}_grpc_server_tls_handshake_failures_total`,
      );
      for (const [what, presented] of [
        ['plaintext', 'plaintext'],
        ['TLS without a certificate', 'no certificate'],
        ['a certificate of another CA', foreign],
        ['an expired certificate', expired],
      ] as const) {
        const outcome = await probe(target.address, target.service, target.method, {}, presented, caPem);
        lines.push(`${target.callee} ${target.method} with ${what}: ${grpc.status[outcome.code]}`);
        expect({ target: target.callee, what, code: outcome.code }).toEqual({
          target: target.callee,
          what,
          code: grpc.status.UNAVAILABLE,
        });
      }
      const after = await metricValue(
        fixture.system.metricsUrl(target.callee),
        `infermesh_${target.callee}_grpc_server_tls_handshake_failures_total`,
      );
      // The TLS refusals are counted where they happen (plaintext is no TLS handshake at all).
      expect(after - before).toBeGreaterThanOrEqual(2);
    }
    console.log(`refused without a mesh identity:\n  ${lines.join('\n  ')}`);
    expect(readFileSync(fixture.logFile, 'utf8')).toContain(
      'refused a TLS connection: the peer did not prove a mesh identity',
    );
  }, 90_000);

  it('allows each method to the identities the policy names, and refuses the others with PERMISSION_DENIED naming them', async () => {
    const lines: string[] = [];
    for (const target of targets()) {
      const refused = await probe(target.address, target.service, target.method, {}, await as(target.refused), caPem);
      lines.push(
        `${target.refused} -> ${target.callee} ${target.method}: ${grpc.status[refused.code]} (${refused.details.slice(0, 120)})`,
      );
      expect({ target: target.callee, code: refused.code }).toEqual({
        target: target.callee,
        code: grpc.status.PERMISSION_DENIED,
      });
      expect(refused.details).toContain(`spiffe://infermesh.local/${target.refused} may not call`);
      const allowed = await probe(target.address, target.service, target.method, {}, await as(target.allowed), caPem);
      lines.push(`${target.allowed} -> ${target.callee} ${target.method}: ${grpc.status[allowed.code]}`);
      // Allowed through: answered by the service itself (an empty request may be a bad one, never a refusal).
      expect([grpc.status.PERMISSION_DENIED, grpc.status.UNAVAILABLE]).not.toContain(allowed.code);
    }
    // Nobody may pin a model on a worker by hand, and the router may not change the registry.
    const pin = await probe(
      fixture.system.grpcAddress('worker'),
      WorkerService,
      'loadModel',
      {},
      await as('batcher'),
      caPem,
    );
    expect(pin.code).toBe(grpc.status.PERMISSION_DENIED);
    const admin = await probe(
      fixture.system.grpcAddress('registry'),
      RegistryService,
      'deleteModel',
      { name: 'models/tiny' },
      await as('router'),
      caPem,
    );
    expect(admin.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(
      await metricValue(
        fixture.system.metricsUrl('registry'),
        'infermesh_registry_grpc_server_unauthorized_calls_total',
        { caller: 'spiffe://infermesh.local/router' },
      ),
    ).toBeGreaterThan(0);
    console.log(`authorization by identity:\n  ${lines.join('\n  ')}`);
    // The model is still there: a refused call changed nothing.
    expect(await inferTinyDistinct(fixture.system.gatewayUrl)).toBe(200);
  }, 60_000);

  it('loses no request while every certificate rotates under load', async () => {
    const certOf = () =>
      new X509Certificate(readFileSync(join(dataDir, 'identity', 'router-0', 'cert.pem'))).serialNumber;
    const serials = new Set([certOf()]);
    const statuses: number[] = [];
    const end = Date.now() + 25_000;
    const clients = Array.from({ length: 16 }, async () => {
      while (Date.now() < end) statuses.push(await inferTinyDistinct(fixture.system.gatewayUrl));
    });
    while (Date.now() < end) {
      serials.add(certOf());
      await new Promise((r) => setTimeout(r, 500));
    }
    await Promise.all(clients);
    // A new connection now meets the router's latest certificate, not the one it started with.
    const operator = await as('operator');
    const presented = await new Promise<string>((resolve, reject) => {
      const [host, port] = fixture.system.grpcAddress('router').split(':');
      const socket = connect(
        {
          host,
          port: Number(port),
          ca: caPem,
          cert: operator.certPem,
          key: operator.keyPem,
          ALPNProtocols: ['h2'],
          servername: 'router.infermesh.local',
          checkServerIdentity: () => undefined,
        },
        () => {
          resolve(socket.getPeerCertificate().serialNumber);
          socket.end();
        },
      );
      socket.on('error', reject);
    });
    // (The file may have rotated once more in the second it takes the service to reread it.)
    expect([...serials, certOf()]).toContain(presented);
    expect(presented).not.toBe([...serials][0]);
    const failed = statuses.filter((s) => s !== 200);
    console.log(
      `rotation under load: ${statuses.length} requests at c=16 over 25 s, ${failed.length} failed; the router's certificate was issued ${serials.size - 1} more times (20 s lifetime, renewed at half-life)`,
    );
    expect(failed).toEqual([]);
    expect(serials.size).toBeGreaterThanOrEqual(3);
  }, 60_000);
});
