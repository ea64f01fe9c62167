import { fromBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import type { AddressInfo } from 'node:net';
import { constants as http2Constants, createServer, type ServerHttp2Stream } from 'node:http2';
import { performance } from 'node:perf_hooks';
import { ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { CallFailed, LoadClient, seededRequests } from './raw-infer';

describe(seededRequests.name, () => {
  it('gives every seed the benchmarks use a request of its own, the seed read back from its input', () => {
    const withSeed = seededRequests('mlp', [512]);
    // The seeds of the path benchmark's phases and warm-ups reach 9e8, far above 2^24, where float32
    // holds only every 64th integer.
    for (const base of [0, 2e7, 4e7 + 16e5, 9e8]) {
      const seen = new Set<string>();
      for (let seed = base; seed < base + 2_000; seed++) {
        const request = fromBinary(ModelInferRequestSchema, withSeed(seed));
        const input = new Float32Array(new Uint8Array(request.rawInputContents[0]!).buffer);
        expect(input[0]! + input[1]! * 65_536).toBe(seed);
        expect(input.slice(2).every((v) => v === 1)).toBe(true);
        seen.add(Buffer.from(request.rawInputContents[0]!).toString('hex'));
      }
      expect(seen.size).toBe(2_000);
    }
  });
});

describe(LoadClient.name, () => {
  const identity = (bytes: Buffer) => bytes;
  const servers: grpc.Server[] = [];
  afterEach(() => servers.splice(0).forEach((server) => server.forceShutdown()));

  /** A grpc-js server on `port` (0: any) whose /t.T/Echo answers the request's bytes reversed, and /t.T/Refuse fails RESOURCE_EXHAUSTED. */
  async function serve(port = 0): Promise<number> {
    const server = new grpc.Server();
    server.register(
      '/t.T/Echo',
      (call: grpc.ServerUnaryCall<Buffer, Buffer>, done: grpc.sendUnaryData<Buffer>) =>
        done(null, Buffer.from(call.request).reverse()),
      identity,
      identity,
      'unary',
    );
    server.register(
      '/t.T/Refuse',
      (call: grpc.ServerUnaryCall<Buffer, Buffer>, done: grpc.sendUnaryData<Buffer>) =>
        done({
          code: grpc.status.RESOURCE_EXHAUSTED,
          details: `over the limit, 100% full; key ${String(call.metadata.get('authorization')[0])}`,
        }),
      identity,
      identity,
      'unary',
    );
    const bound = await new Promise<number>((resolve, reject) =>
      server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (error, p) =>
        error ? reject(error) : resolve(p),
      ),
    );
    servers.push(server);
    return bound;
  }

  it('answers with the message the server sent, whole however it was split', async () => {
    const client = new LoadClient(`127.0.0.1:${await serve()}`);
    const request = Buffer.from(Array.from({ length: 300_000 }, (_, i) => i % 251));
    const answer = await client.call('/t.T/Echo', request, 5_000);
    expect(answer.equals(Buffer.from(request).reverse())).toBe(true);
    expect((await client.call('/t.T/Echo', Buffer.alloc(0), 5_000)).length).toBe(0);
    client.close();
  });

  it("fails with the server's status and its message, decoded, and sends the caller's headers", async () => {
    const client = new LoadClient(`127.0.0.1:${await serve()}`);
    const failure = await client
      .call('/t.T/Refuse', Buffer.from('x'), 5_000, { authorization: 'Bearer k' })
      .catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(CallFailed);
    expect(failure).toMatchObject({
      code: grpc.status.RESOURCE_EXHAUSTED,
      details: 'over the limit, 100% full; key Bearer k',
    });
    client.close();
  });

  it('fails DEADLINE_EXCEEDED when no answer comes within the timeout, from a server that ignores grpc-timeout', async () => {
    // A bare HTTP/2 server that takes each stream and never answers it (grpc-js's would fail it itself at the deadline).
    const silent = createServer();
    const held: ServerHttp2Stream[] = [];
    silent.on('stream', (stream) => held.push(stream));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const client = new LoadClient(`127.0.0.1:${(silent.address() as AddressInfo).port}`);
    const started = performance.now();
    await expect(client.call('/t.T/Never', Buffer.from('x'), 200)).rejects.toMatchObject({
      code: grpc.status.DEADLINE_EXCEEDED,
    });
    expect(performance.now() - started).toBeGreaterThanOrEqual(190);
    expect(held).toHaveLength(1);
    client.close();
    await new Promise((resolve) => silent.close(resolve));
  });

  it('fails RESOURCE_EXHAUSTED, as grpc-js does, when the server refuses the stream (reset ENHANCE_YOUR_CALM), and UNAVAILABLE when it resets it otherwise', async () => {
    // A bare HTTP/2 server resetting each stream as it comes, with the code its path names.
    const resetting = createServer();
    resetting.on('stream', (stream, headers) => {
      stream.on('error', () => undefined);
      stream.close(
        headers[':path'] === '/t.T/Calm'
          ? http2Constants.NGHTTP2_ENHANCE_YOUR_CALM
          : http2Constants.NGHTTP2_REFUSED_STREAM,
      );
    });
    await new Promise<void>((resolve) => resetting.listen(0, '127.0.0.1', resolve));
    const client = new LoadClient(`127.0.0.1:${(resetting.address() as AddressInfo).port}`);
    try {
      await expect(client.call('/t.T/Calm', Buffer.from('x'), 5_000)).rejects.toMatchObject({
        code: grpc.status.RESOURCE_EXHAUSTED,
        details: 'the server refused the stream (HTTP/2 ENHANCE_YOUR_CALM)',
        rstCode: http2Constants.NGHTTP2_ENHANCE_YOUR_CALM,
      });
      await expect(client.call('/t.T/Refused', Buffer.from('x'), 5_000)).rejects.toMatchObject({
        code: grpc.status.UNAVAILABLE,
        details: `the stream closed without a status (HTTP/2 code ${http2Constants.NGHTTP2_REFUSED_STREAM})`,
      });
    } finally {
      client.close();
      await new Promise((resolve) => resetting.close(resolve));
    }
  });

  it('keeps thousands of calls in flight on its one connection without resetting any itself', async () => {
    // Node's HTTP/2 client refuses a session more than 10 MB of its own by default: it resets the
    // streams over that with ENHANCE_YOUR_CALM, and a server's rapid-reset guard (Node's default:
    // 1,000 resets, then 33 a second) answers those with GOAWAY, failing every call on the connection.
    const server = new grpc.Server();
    server.register(
      '/t.T/Slow',
      (call: grpc.ServerUnaryCall<Buffer, Buffer>, done: grpc.sendUnaryData<Buffer>) =>
        setTimeout(() => done(null, call.request.subarray(0, 1)), 300),
      identity,
      identity,
      'unary',
    );
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, p) =>
        error ? reject(error) : resolve(p),
      ),
    );
    servers.push(server);
    const client = new LoadClient(`127.0.0.1:${port}`);
    const calls = 8_000;
    const outcomes = await Promise.all(
      Array.from({ length: calls }, (_, i) =>
        client.call('/t.T/Slow', Buffer.alloc(2_100, i % 256), 60_000).then(
          () => 'ok',
          (e: unknown) => (e instanceof CallFailed ? `${grpc.status[e.code]} ${e.details}` : String(e)),
        ),
      ),
    );
    const tally: Record<string, number> = {};
    for (const outcome of outcomes) tally[outcome] = (tally[outcome] ?? 0) + 1;
    expect(tally).toEqual({ ok: calls });
    client.close();
  });

  it('fails UNAVAILABLE while no server listens, and connects again once one does', async () => {
    const port = await serve();
    const client = new LoadClient(`127.0.0.1:${port}`);
    expect((await client.call('/t.T/Echo', Buffer.from('ab'), 5_000)).toString()).toBe('ba');
    servers.splice(0).forEach((server) => server.forceShutdown());
    await expect(client.call('/t.T/Echo', Buffer.from('ab'), 5_000)).rejects.toMatchObject({
      code: grpc.status.UNAVAILABLE,
    });
    await serve(port);
    expect((await client.call('/t.T/Echo', Buffer.from('cd'), 5_000)).toString()).toBe('dc');
    client.close();
  });
});
