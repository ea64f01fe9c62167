import { connect, createServer, type ClientHttp2Session, type ServerHttp2Session, type Settings } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import type * as grpc from '@grpc/grpc-js';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { FLOW_CONTROL_WINDOW_BYTES } from './flow-control';
import { createClient } from './grpc-client';
import { GrpcServer, onHttp2Servers } from './grpc-server';
import { HealthService } from './health';
import { eventually } from '@infermesh/clock/waiting.testing';

const HTTP2_DEFAULT_WINDOW = 65_535;

describe('HTTP/2 flow-control windows', () => {
  it('a server lets each peer send FLOW_CONTROL_WINDOW_BYTES, per stream and per connection, before it must wait for a window update', async () => {
    const server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: new Metrics('test'),
      maxMessageBytes: 1024 * 1024,
    });
    server.add(Health, new HealthService());
    const port = await server.listen('127.0.0.1', 0);
    const session: ClientHttp2Session = connect(`http://127.0.0.1:${port}`);
    try {
      await new Promise((resolve) => session.once('remoteSettings', resolve));
      expect(session.remoteSettings.initialWindowSize).toBe(FLOW_CONTROL_WINDOW_BYTES);
      // The connection's window comes in a WINDOW_UPDATE after the settings (Node emits no event for it).
      await eventually(() => session.state.remoteWindowSize! >= FLOW_CONTROL_WINDOW_BYTES);
      expect(session.state.remoteWindowSize).toBe(FLOW_CONTROL_WINDOW_BYTES);
    } finally {
      session.destroy();
      await server.shutdown(100);
    }
  });

  it('a client lets a server send FLOW_CONTROL_WINDOW_BYTES per stream before it must wait for a window update', async () => {
    const sessions: ServerHttp2Session[] = [];
    const peer = createServer();
    const clientSettings = new Promise<Settings>((resolve) =>
      peer.on('session', (s) => {
        sessions.push(s);
        s.once('remoteSettings', resolve);
      }),
    );
    await new Promise<void>((resolve) => peer.listen(0, '127.0.0.1', resolve));
    const client = createClient(Health, `127.0.0.1:${(peer.address() as AddressInfo).port}`);
    try {
      // The call fails (this peer is no gRPC server); what counts is the client's settings.
      void client.check({ service: '' }, { timeoutMs: 2_000 }).catch(() => undefined);
      expect((await clientSettings).initialWindowSize).toBe(FLOW_CONTROL_WINDOW_BYTES);
      expect(FLOW_CONTROL_WINDOW_BYTES).toBeGreaterThan(HTTP2_DEFAULT_WINDOW);
    } finally {
      client.close();
      for (const s of sessions) s.destroy();
      await new Promise((resolve) => peer.close(resolve));
    }
  });

  it('carries large messages both ways at once: concurrent calls of 16 MB each way all finish', async () => {
    // With windows wider than the sockets hold (16 MiB), both ends wrote more than the other read,
    // Node's HTTP/2 stopped reading while its writes waited, and both calls ran into their deadline.
    const server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: new Metrics('test'),
      maxMessageBytes: 64 * 1024 * 1024,
    });
    server.add(
      RouterService,
      { infer: ({ request }) => Promise.resolve({ response: { id: request!.id, outputs: request!.inputs } }) },
      { infers: 'infer' },
    );
    // The connections, to close them whatever state they are in: a stalled one never ends by itself,
    // and would keep jest from exiting after a failure.
    const sockets = new Set<Socket>();
    onHttp2Servers((server as unknown as { server: grpc.Server }).server, (http2Server) =>
      http2Server.on('connection', (socket: Socket) => sockets.add(socket)),
    );
    const port = await server.listen('127.0.0.1', 0);
    const client = createClient(RouterService, `127.0.0.1:${port}`, { maxMessageBytes: 64 * 1024 * 1024 });
    const bytes = 16_000_000;
    try {
      const answers = await Promise.all(
        [1, 2, 3, 4].map((seed) =>
          client.infer(
            {
              request: {
                id: String(seed),
                inputs: [
                  {
                    name: 'x',
                    datatype: DataType.UINT8,
                    shape: [BigInt(bytes)],
                    data: new Uint8Array(bytes).fill(seed),
                  },
                ],
              },
            },
            { timeoutMs: 20_000 },
          ),
        ),
      );
      expect(
        answers.map((a) => [
          a.response?.id,
          a.response?.outputs[0]?.data.byteLength,
          a.response?.outputs[0]?.data[bytes - 1],
        ]),
      ).toEqual([
        ['1', bytes, 1],
        ['2', bytes, 2],
        ['3', bytes, 3],
        ['4', bytes, 4],
      ]);
    } finally {
      client.close();
      for (const socket of sockets) socket.destroy();
      await server.shutdown(100);
    }
  });
});
