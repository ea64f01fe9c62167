import { createServer, type Server, type Socket } from 'node:net';
import { once } from 'node:events';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { createClient } from './grpc-client';

describe(createClient.name, () => {
  let listener: Server;
  let port: number;
  const sockets: Socket[] = [];

  beforeEach(async () => {
    sockets.length = 0;
    // A bare TCP listener: it counts the connections a client opens, whatever it then says.
    listener = createServer((socket) => {
      sockets.push(socket);
      socket.on('error', () => undefined);
    });
    listener.listen(0, '127.0.0.1');
    await once(listener, 'listening');
    port = (listener.address() as { port: number }).port;
  });

  afterEach(async () => {
    for (const socket of sockets) socket.destroy();
    listener.close();
    await once(listener, 'close');
  });

  it('connects on the first call, or at once when told to (connect), before any call', async () => {
    const lazy = createClient(Health, `127.0.0.1:${port}`);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(sockets).toHaveLength(0);

    const eager = createClient(Health, `127.0.0.1:${port}`);
    eager.connect();
    const deadline = Date.now() + 5_000;
    while (sockets.length === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(sockets).toHaveLength(1);

    lazy.close();
    eager.close();
  });
});
