import * as grpc from '@grpc/grpc-js';
import { eventually, ManualClock } from '@infermesh/testing';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type IdentityIssuedEvent, IdentityIssuer } from './identity-issuer';
import { identityPaths } from './identity-files';
import { LocalCa } from './local-ca';
import { subjectAltNames } from './read-identity';

const REFRESH_MS = 100;
/** Certificates live a minute (of the real clock, which TLS checks them by); the issuer renews them at half-life on its own clock. */
const LIFETIME_MS = 60_000;
const passThrough = (value: Buffer): Buffer => value;
const WHO_AM_I: grpc.MethodDefinition<Buffer, Buffer> = {
  path: '/identity.test.Peer/WhoAmI',
  requestStream: false,
  responseStream: false,
  requestSerialize: passThrough,
  requestDeserialize: passThrough,
  responseSerialize: passThrough,
  responseDeserialize: passThrough,
};

/** grpc-js's own file watcher over an instance's folder: how the services read the identity files. */
function provider(dir: string): grpc.experimental.FileWatcherCertificateProvider {
  const { certFile, keyFile, caFile } = identityPaths(dir);
  return new grpc.experimental.FileWatcherCertificateProvider({
    certificateFile: certFile,
    privateKeyFile: keyFile,
    caCertificateFile: caFile,
    refreshIntervalMs: REFRESH_MS,
  });
}

/** Mutual TLS between grpc-js peers that read the identity files, as rotation replaces them. */
describe('grpc-js mutual TLS over the identity files', () => {
  let root: string;
  let ca: LocalCa;
  let issuer: IdentityIssuer;
  let clock: ManualClock;
  let server: grpc.Server;
  let port: number;
  const clientIssued: IdentityIssuedEvent[] = [];

  /** The SPIFFE ID and serial number of the client certificate the server saw, over a new connection. */
  async function call(clientDir: string): Promise<string> {
    const provided = provider(clientDir);
    // Default host-name check: the server's certificate must name 127.0.0.1 (its IP SAN).
    const credentials = grpc.experimental.createCertificateProviderChannelCredentials(provided, provided);
    const client = new grpc.Client(`127.0.0.1:${port}`, credentials, { 'grpc.use_local_subchannel_pool': 1 });
    try {
      return await new Promise<string>((resolve, reject) => {
        client.makeUnaryRequest(
          WHO_AM_I.path,
          passThrough,
          passThrough,
          Buffer.alloc(0),
          { deadline: Date.now() + 5000 },
          (error, response) => {
            if (error) reject(error);
            else resolve(response!.toString());
          },
        );
      });
    } finally {
      client.close();
    }
  }

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'grpc-mtls-'));
    ca = await LocalCa.open(join(root, 'ca'));
    clock = new ManualClock(Date.now());
    issuer = new IdentityIssuer({
      ca,
      rootDir: root,
      lifetimeMs: LIFETIME_MS,
      clock,
      onIssued: (event) => clientIssued.push(event),
    });
    const serverDir = await issuer.ensure({ service: 'registry', instance: 'registry' });
    const provided = provider(serverDir);
    server = new grpc.Server();
    server.addService(
      { whoAmI: WHO_AM_I },
      {
        whoAmI: (peerCall: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
          const certificate = peerCall.getAuthContext().sslPeerCertificate;
          const uri = subjectAltNames(certificate?.subjectaltname).find((name) => name.type === 'URI');
          callback(null, Buffer.from(`${uri?.value ?? 'none'} ${certificate?.serialNumber ?? 'none'}`));
        },
      },
    );
    port = await new Promise<number>((resolve, reject) =>
      server.bindAsync(
        '127.0.0.1:0',
        grpc.experimental.createCertificateProviderServerCredentials(provided, provided, true),
        (error, bound) => (error ? reject(error) : resolve(bound)),
      ),
    );
  });

  afterAll(() => {
    issuer.stop();
    server.forceShutdown();
    rmSync(root, { recursive: true, force: true });
  });

  it("connects peers of one CA, the server seeing the client's SPIFFE ID, and takes rotated certificates", async () => {
    const clientDir = await issuer.ensure({ service: 'router', instance: 'router-0' });
    const first = clientIssued.filter((event) => event.dir === clientDir).at(-1)!;

    expect(await call(clientDir)).toBe(`spiffe://infermesh.local/router ${first.serialNumber}`);

    // Rotated at half-life: half of what is left of the lifetime as the certificate's notAfter says,
    // which the CA counts from its own time (whole seconds), not the manual clock's.
    expect(clientIssued.some((event) => event.dir === clientDir && event.rotated)).toBe(false);
    expect(first.renewAt.getTime() - clock.now()).toBeGreaterThanOrEqual(LIFETIME_MS / 2 - 1_000);
    clock.advance(first.renewAt.getTime() - clock.now());
    await eventually(() => clientIssued.some((event) => event.dir === clientDir && event.rotated));
    const rotatedSerials = clientIssued
      .filter((event) => event.dir === clientDir && event.rotated)
      .map((event) => event.serialNumber);
    expect(rotatedSerials).not.toContain(first.serialNumber);

    // The server's grpc-js rereads its files every REFRESH_MS of its own: the rotated client is taken
    // once it has (its own certificate was rotated too).
    let serial: string | undefined;
    await eventually(async () => {
      serial = await call(clientDir).then(
        (answer) => answer.split(' ')[1],
        () => undefined,
      );
      return serial !== undefined && rotatedSerials.includes(serial);
    });
  });

  it('refuses a client whose certificate comes from another local CA', async () => {
    const otherCa = await LocalCa.open(join(root, 'other-ca'));
    const otherIssuer = new IdentityIssuer({ ca: otherCa, rootDir: join(root, 'other') });
    try {
      const intruderDir = await otherIssuer.ensure({ service: 'router', instance: 'router-0' });
      // It trusts the real CA, so that only its own certificate is wrong.
      const realBundle = identityPaths(join(root, 'registry')).caFile;
      const { certFile, keyFile } = identityPaths(intruderDir);
      const provided = new grpc.experimental.FileWatcherCertificateProvider({
        certificateFile: certFile,
        privateKeyFile: keyFile,
        caCertificateFile: realBundle,
        refreshIntervalMs: REFRESH_MS,
      });
      const client = new grpc.Client(
        `127.0.0.1:${port}`,
        grpc.experimental.createCertificateProviderChannelCredentials(provided, provided),
        {
          'grpc.use_local_subchannel_pool': 1,
        },
      );
      const error = await new Promise<grpc.ServiceError | null>((resolve) =>
        client.makeUnaryRequest(
          WHO_AM_I.path,
          passThrough,
          passThrough,
          Buffer.alloc(0),
          { deadline: Date.now() + 3000 },
          (failure) => resolve(failure),
        ),
      );
      client.close();

      expect(error?.code).toBe(grpc.status.UNAVAILABLE);
    } finally {
      otherIssuer.stop();
    }
  });
});
