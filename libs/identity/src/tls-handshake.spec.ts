import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type ConnectionOptions, connect, createServer, type Server, type TLSSocket } from 'node:tls';
import { eventually } from '@infermesh/testing';
import { serviceOfSpiffeId } from './spiffe-id';
import { type IdentityPaths, writeIdentityFiles } from './identity-files';
import { LocalCa, type ServiceIdentity } from './local-ca';
import { subjectAltNames } from './read-identity';

/** Mutual TLS with nothing but the identity files: what every service of `infermesh up` does. */
describe('mutual TLS with issued identities', () => {
  let root: string;
  let ca: LocalCa;
  let server: Server;
  let port: number;
  let serverErrors: Error[];
  let accepted: string[];

  async function identityOf(authority: LocalCa, identity: ServiceIdentity): Promise<IdentityPaths> {
    return writeIdentityFiles(
      join(root, `${identity.instance}-${Math.random().toString(16).slice(2)}`),
      await authority.issue(identity, 3_600_000),
      authority.bundlePem,
    );
  }

  function tlsOptions(paths: IdentityPaths): { cert: Buffer; key: Buffer; ca: Buffer } {
    return { cert: readFileSync(paths.certFile), key: readFileSync(paths.keyFile), ca: readFileSync(paths.caFile) };
  }

  /** What the server said to a client before the connection closed, and the error that closed it if any. */
  async function talk(options: ConnectionOptions): Promise<{ said: string; error?: NodeJS.ErrnoException }> {
    return new Promise((resolve) => {
      let said = '';
      let error: NodeJS.ErrnoException | undefined;
      const socket = connect({ host: '127.0.0.1', port, ...options });
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => (said += chunk));
      socket.on('error', (failure: NodeJS.ErrnoException) => {
        error = failure;
      });
      socket.on('close', () => resolve(error === undefined ? { said } : { said, error }));
    });
  }

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'tls-handshake-'));
    ca = await LocalCa.open(join(root, 'ca'));
    const serverPaths = await identityOf(ca, { service: 'registry', instance: 'registry' });
    serverErrors = [];
    accepted = [];
    server = createServer(
      { ...tlsOptions(serverPaths), requestCert: true, rejectUnauthorized: true },
      (socket: TLSSocket) => {
        const peer = subjectAltNames(socket.getPeerCertificate().subjectaltname).find((name) => name.type === 'URI');
        const service = serviceOfSpiffeId(peer?.value ?? '') ?? 'nobody';
        accepted.push(service);
        socket.end(`hello ${service}`);
      },
    );
    server.on('tlsClientError', (error) => serverErrors.push(error));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });

  afterAll(async () => {
    await new Promise((resolve) => server.close(resolve));
    rmSync(root, { recursive: true, force: true });
  });

  it("lets a client of the same CA in, each side checking the other's certificate", async () => {
    const client = await identityOf(ca, { service: 'router', instance: 'router-0' });

    await expect(talk(tlsOptions(client))).resolves.toEqual({ said: 'hello router' });
  });

  it('refuses a client whose certificate comes from another local CA', async () => {
    const otherCa = await LocalCa.open(join(root, 'other-ca'));
    const intruder = await identityOf(otherCa, { service: 'router', instance: 'router-0' });
    // It trusts the real CA, so that only its own certificate is wrong.
    const before = serverErrors.length;
    const acceptedBefore = [...accepted];

    const result = await talk(tlsOptions({ ...intruder, caFile: join(root, 'ca', 'ca.pem') }));

    // With TLS 1.3 the client's side of the handshake is done before the server checks its
    // certificate: it sees the server close without a word; the server's handshake fails (Node
    // reports it as a hang-up) and its connection handler never runs.
    expect(result.said).toBe('');
    await eventually(() => serverErrors.length > before);
    expect(accepted).toEqual(acceptedBefore);
  });

  it('refuses a client without a certificate', async () => {
    const before = serverErrors.length;

    const result = await talk({ ca: readFileSync(join(root, 'ca', 'ca.pem')) });

    expect(result.said).toBe('');
    await eventually(() => serverErrors.length > before);
    expect(serverErrors[before]!.message).toMatch(/certificate/i);
  });

  it('lets the client refuse a server of another CA', async () => {
    const client = await identityOf(ca, { service: 'router', instance: 'router-0' });
    const otherCa = await LocalCa.open(join(root, 'other-ca'));

    const result = await talk(tlsOptions({ ...client, caFile: join(otherCa.dir, 'ca.pem') }));

    expect(result.said).toBe('');
    // OpenSSL's chain verification error; both CAs share one subject name, which it reports as
    // SELF_SIGNED_CERT_IN_CHAIN rather than a missing issuer.
    expect(result.error?.code).toMatch(/CERT|SIGNATURE|ISSUER/);
  });
});
