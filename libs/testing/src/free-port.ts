import { createServer, type Server } from 'node:net';

/** A TCP port that was free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  return (await freePortList(1))[0]!;
}

/**
 * `count` distinct TCP ports that were free on 127.0.0.1 a moment ago. They are all held while
 * they are chosen, so that the system cannot hand out the same port twice (taking and releasing
 * ports one by one can).
 */
export async function freePortList(count: number): Promise<number[]> {
  const servers: Server[] = [];
  try {
    for (let i = 0; i < count; i++) {
      servers.push(
        await new Promise<Server>((resolve, reject) => {
          const server = createServer();
          server.once('error', reject);
          server.listen(0, '127.0.0.1', () => resolve(server));
        }),
      );
    }
    return servers.map((server) => {
      const address = server.address();
      return typeof address === 'object' && address !== null ? address.port : 0;
    });
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
}
